# Sourced by the scripts that run the sanitizer build (sanitize-and-fuzz.sh, fuzz-explore.sh):
# one set of runtime options for both.
#
# libtorch and libhdf5 are not instrumented; container-overflow checks need every std::vector
# user instrumented, so they are off. Leaks are checked.
#
# intercept_tls_get_addr=0: the sanitizer runtime of LLVM up to 16 (Debian 12 ships clang 14)
# takes a dynamic TLS block whose start is 16 bytes past a page boundary for one carrying the
# header glibc 2.19-2.24 put there, and records the two words before it as the block's range.
# glibc 2.25 and later have no such header; a block lands at that offset by chance (it is
# malloc'd), the range recorded is garbage, and LeakSanitizer's tracer dies scanning it at exit
# ("Tracer caught signal 11", abort): a red job with every test passed, on some runs only.
# With the interception off, dynamic TLS is not scanned for roots: a pointer held only there
# would read as a leak (a false report, never a missed one). docs/building.md, "The hardening
# job".
export ASAN_OPTIONS=detect_container_overflow=0:abort_on_error=1:detect_leaks=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0

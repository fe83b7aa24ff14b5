#include <malloc.h>

#include <climits>
#include <csignal>

#include "harness/cli/cli.h"

int main(int argc, char** argv) {
  // Cases allocate and free matrices by the hundred megabytes. glibc maps each from the kernel
  // and unmaps it on free, so every new one is page-faulted and zeroed again: a fifth of a 7B
  // layer case's run time on 2 cores went to clear_page and page faults (perf). Served from a
  // heap that keeps freed memory instead: base phase 12.5 -> 7.3 s, generate 7.7 -> 6.6 s
  // (docs/measurements/malloc-reuse-cpu.log). Resident memory stays at its high-water mark.
  // This governs the main arena; other threads' arenas still map requests above their
  // 64 MiB heaps (glibc), which the large matrices of the CPU phases are not.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, which the output code
  // reports (exit 2), instead of the signal killing the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  return gradscope::run_cli(argc, argv);
}

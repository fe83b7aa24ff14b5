#include <malloc.h>

#include <climits>
#include <csignal>

#include "harness/cli/cli.h"

int main(int argc, char** argv) {
  // Cases allocate and free large matrices over and over; glibc maps each from the kernel and
  // unmaps it on free, so every new one is page-faulted and zeroed again. A heap that keeps
  // freed memory serves them instead (figures: docs/performance.md); resident memory stays at
  // its high-water mark. One arena for every thread, so that what one of the reference's threads
  // frees (attention's per-head blocks) serves the next allocation on any thread, not only on
  // its own.
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, which the output code
  // reports (exit 2), instead of the signal killing the process mid-write.
  std::signal(SIGXFSZ, SIG_IGN);
  return gradscope::run_cli(argc, argv);
}

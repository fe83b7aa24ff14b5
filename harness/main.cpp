#include "harness/cli.h"

int main(int argc, char** argv) {
  return gradscope::run_cli(argc, argv);
}

# Compiler cache and CUDA architecture. Kept apart from the targets so the
# build files below read as "what is built", not "how".

find_program(GRADSCOPE_CCACHE ccache)
if(GRADSCOPE_CCACHE)
  # Precompiled headers need these sloppiness settings or ccache never hits;
  # BASEDIR makes a fresh clone in another folder reuse the cache.
  set(_launcher ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${CMAKE_SOURCE_DIR} ${GRADSCOPE_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${_launcher})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${_launcher})
endif()

if(GRADSCOPE_WITH_CUDA)
  # Hopper (H100/H200) is the target GPU; torch's config reads TORCH_CUDA_ARCH_LIST
  # for its own flags and ignores CMAKE_CUDA_ARCHITECTURES.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA arch list for torch's config")
  enable_language(CUDA)
  # Global, not per target: every target shares one precompiled header, which
  # GCC only accepts where the same macros are defined.
  add_compile_definitions(GRADSCOPE_WITH_CUDA)
endif()

# The hardening build (scripts/sanitize-and-fuzz.sh): ASan + UBSan on every first-party
# target, and with GRADSCOPE_FUZZ coverage instrumentation for libFuzzer (clang only).
option(GRADSCOPE_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(GRADSCOPE_FUZZ "Build the libFuzzer targets in tests/fuzz (needs clang)" OFF)
if(GRADSCOPE_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
if(GRADSCOPE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "GRADSCOPE_FUZZ needs clang (libFuzzer); configure with CXX=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

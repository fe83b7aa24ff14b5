# Third-party libraries. Each is found, never vendored; scripts/install-deps.sh
# installs them on a fresh machine.

# LibTorch comes from the Python `torch` wheel; ask that interpreter where it is.
if(NOT Torch_DIR AND NOT CMAKE_PREFIX_PATH MATCHES "torch")
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _torch_rc ERROR_QUIET)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "gradscope: `${Python3_EXECUTABLE} -c 'import torch'` failed; "
                        "run scripts/install-deps.sh (it installs torch==2.11.0 from PyPI)")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${_torch_prefix})
endif()
find_package(Torch REQUIRED)
# torch's config appends its flags to CMAKE_CXX_FLAGS; targets use TORCH_LIBRARIES.
message(STATUS "gradscope: torch ${Torch_VERSION} from ${Torch_DIR}")
# LibTorch as one target. OpenMP with it: ATen's at::parallel_for is an inline template that
# runs its loop in parallel only where the including code is compiled with -fopenmp
# (ParallelOpenMP.h checks _OPENMP).
find_package(OpenMP REQUIRED COMPONENTS CXX)
add_library(gradscope_torch INTERFACE)
target_link_libraries(gradscope_torch INTERFACE ${TORCH_LIBRARIES} OpenMP::OpenMP_CXX)

find_package(Eigen3 3.3 REQUIRED NO_MODULE)

# The reference's fp64 products run on OpenBLAS from the pinned PyPI wheel scipy-openblas32
# (reference/dense_product.h): its symbols carry a scipy_ prefix, so they never meet the BLAS
# inside libtorch. Found through the interpreter torch came from, else unpacked in .devdeps on
# a machine without a package index (scripts/fill-devdeps.sh).
find_package(Python3 COMPONENTS Interpreter REQUIRED)
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
          "import os, scipy_openblas32 as s; print(os.path.dirname(os.path.dirname(s.__file__)))"
  OUTPUT_VARIABLE _openblas_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
find_path(GRADSCOPE_OPENBLAS_ROOT scipy_openblas32/include/cblas.h
          HINTS ${_openblas_site} ${CMAKE_SOURCE_DIR}/.devdeps/python NO_DEFAULT_PATH)
find_library(GRADSCOPE_OPENBLAS_LIBRARY scipy_openblas
             HINTS ${GRADSCOPE_OPENBLAS_ROOT}/scipy_openblas32/lib NO_DEFAULT_PATH)
if(NOT GRADSCOPE_OPENBLAS_ROOT OR NOT GRADSCOPE_OPENBLAS_LIBRARY)
  message(FATAL_ERROR "gradscope: OpenBLAS (the Python wheel scipy-openblas32) not found; "
                      "run scripts/install-deps.sh, or scripts/fill-devdeps.sh for a machine "
                      "without a package index")
endif()
add_library(gradscope_openblas SHARED IMPORTED)
set_target_properties(gradscope_openblas PROPERTIES
  IMPORTED_LOCATION ${GRADSCOPE_OPENBLAS_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${GRADSCOPE_OPENBLAS_ROOT}/scipy_openblas32/include)
message(STATUS "gradscope: OpenBLAS ${GRADSCOPE_OPENBLAS_LIBRARY}")
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 CONFIG REQUIRED)

# toml++ is used header-only: Debian puts it in /usr/include, the GPU machine
# gets the headers carried in .devdeps (scripts/fill-devdeps.sh; docs/building.md).
find_path(GRADSCOPE_TOMLPP_INCLUDE_DIR toml++/toml.h HINTS ${CMAKE_SOURCE_DIR}/.devdeps/usr/include)
if(NOT GRADSCOPE_TOMLPP_INCLUDE_DIR)
  message(FATAL_ERROR "gradscope: toml++ not found (apt-get install libtomlplusplus-dev)")
endif()
add_library(gradscope_tomlplusplus INTERFACE)
target_include_directories(gradscope_tomlplusplus SYSTEM INTERFACE ${GRADSCOPE_TOMLPP_INCLUDE_DIR})
target_compile_definitions(gradscope_tomlplusplus INTERFACE TOML_HEADER_ONLY=1 TOML_EXCEPTIONS=1)

if(GRADSCOPE_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND AND EXISTS /usr/src/googletest/CMakeLists.txt)
    # Some images ship GoogleTest as sources only.
    add_subdirectory(/usr/src/googletest ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
    add_library(GTest::gtest_main ALIAS gtest_main)
  elseif(NOT GTest_FOUND)
    message(FATAL_ERROR "gradscope: GoogleTest not found (apt-get install libgtest-dev)")
  endif()
endif()

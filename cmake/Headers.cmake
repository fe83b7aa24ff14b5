# Each first-party library exposes exactly its own headers (docs/architecture.md, "Layers"):
# gradscope_headers(<target> <header>...) links each header, under its repository path, into
# an include root of the target's own in the build tree, and gives the target that root
# (PUBLIC; INTERFACE for a header-only target). A file can then include a header only if its
# target links the header's library; a forgotten link fails to compile instead of working
# by accident through the repository root. Headers are listed like sources: a new one is
# added to its library's list.
function(gradscope_headers target)
  set(root ${CMAKE_BINARY_DIR}/include/${target})
  file(REMOVE_RECURSE ${root})
  foreach(header ${ARGN})
    set(source ${CMAKE_CURRENT_SOURCE_DIR}/${header})
    if(NOT EXISTS ${source})
      message(FATAL_ERROR "gradscope_headers(${target}): no header ${source}")
    endif()
    file(RELATIVE_PATH path ${PROJECT_SOURCE_DIR} ${source})
    get_filename_component(folder ${root}/${path} DIRECTORY)
    file(MAKE_DIRECTORY ${folder})
    file(CREATE_LINK ${source} ${root}/${path} SYMBOLIC)
  endforeach()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${target} INTERFACE ${root})
  else()
    target_include_directories(${target} PUBLIC ${root})
  endif()
endfunction()

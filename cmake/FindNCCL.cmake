# FindNCCL
# --------
# Finds NVIDIA's NCCL (no CMake config ships with it). Searched, in order: NCCL_ROOT (CMake or
# environment variable), the CUDA toolkit (dev machines: the CUDA 13 install carries NCCL), then
# the system dirs (GPU machines: Ubuntu's libnccl-dev in /usr/include, /usr/lib/x86_64-linux-gnu).
#
# Result variables:
#   NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION ("2.28.9", from nccl.h),
#   NCCL_VERSION_CODE (e.g. 22809)
# Imported target:
#   NCCL::NCCL  (the shared library, libnccl.so)
#
#   find_package(NCCL 2.28 REQUIRED)
#   target_link_libraries(x PRIVATE NCCL::NCCL)

set(_nccl_hints)
foreach(_root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}" "${NCCL_HOME}" "$ENV{NCCL_HOME}")
  if(_root)
    list(APPEND _nccl_hints "${_root}")
  endif()
endforeach()
set(_nccl_cuda_paths)
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_cuda_paths "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_TARGET_DIR)
  list(APPEND _nccl_cuda_paths "${CUDAToolkit_TARGET_DIR}")
endif()
list(APPEND _nccl_cuda_paths /usr/local/cuda)

# The CUDA toolkit goes in HINTS so that it is searched before the system prefixes.
find_path(NCCL_INCLUDE_DIR NAMES nccl.h
  HINTS ${_nccl_hints} ${_nccl_cuda_paths}
  PATH_SUFFIXES include)
# The library is looked for next to the header first, so both come from one install.
set(_nccl_prefix)
if(NCCL_INCLUDE_DIR)
  get_filename_component(_nccl_prefix "${NCCL_INCLUDE_DIR}" DIRECTORY)
endif()
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS ${_nccl_prefix} ${_nccl_hints} ${_nccl_cuda_paths}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH|VERSION_CODE)[ \t]+[0-9]+")
  foreach(_part IN ITEMS MAJOR MINOR PATCH VERSION_CODE)
    string(REGEX MATCH "#define NCCL_${_part}[ \t]+([0-9]+)" _match "${_nccl_defines}")
    set(_nccl_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT _nccl_MAJOR STREQUAL "" AND NOT _nccl_MINOR STREQUAL "" AND NOT _nccl_PATCH STREQUAL "")
    set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
    set(NCCL_VERSION_CODE "${_nccl_VERSION_CODE}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_cuda_paths)
unset(_nccl_prefix)

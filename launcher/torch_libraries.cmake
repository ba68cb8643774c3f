# batchdist_torch_libraries(OUT): TORCH_LIBRARIES of the Torch that find_package(Torch)
# found, each from that Torch's own lib directory. TorchConfig looks for libc10 on the
# system paths before its own lib directory: with Debian's libtorch-dev installed, a
# pip LibTorch would also link Debian's libc10, and a process with two c10s aborts
# while registering operators. Used by batchdist's build and by its installed CMake
# package (batchdistConfig.cmake), whose users link the same Torch.
function(batchdist_torch_libraries out)
  set(libdir "${TORCH_INSTALL_PREFIX}/lib")
  set(libs)
  foreach(lib IN LISTS TORCH_LIBRARIES)
    get_filename_component(name "${lib}" NAME)
    get_filename_component(dir "${lib}" DIRECTORY)
    if(IS_ABSOLUTE "${lib}" AND NOT dir STREQUAL libdir AND EXISTS "${libdir}/${name}")
      message(STATUS "batchdist: ${lib} is another LibTorch's; using ${libdir}/${name}")
      set(lib "${libdir}/${name}")
    endif()
    list(APPEND libs "${lib}")
  endforeach()
  set(${out} "${libs}" PARENT_SCOPE)
endfunction()

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

# Note [libstdc++ first]: a pip LibTorch's libtorch_cpu.so carries its own copy of
# std::filesystem (and more of libstdc++: the wheels are built with a devtoolset GCC
# on an old base, which links what the base's libstdc++ lacks statically) and
# exports it. The dynamic linker binds a program's calls to the first definition in
# load order, and the linker lists libstdc++.so.6 after every library of the link
# line: a batchdist binary's std::filesystem::remove_all ran torch's copy against
# the compiler's headers. With torch 2.14.1 and GCC 12 that happened to work; on an
# H200 node with torch 2.11.0 and GCC 13 every remove_all crashed (checkpoint
# rotation, 55 unit tests). libstdc++.so.6 as the first needed library makes every
# such call bind to the system's libstdc++, whose ABI the headers promise (torch's
# own calls too, as in any process that loaded libstdc++ before torch). Harmless
# where torch exports nothing of the kind (Debian's libtorch-dev).
# batchdist_stdlib_first(TARGET SCOPE): the link option, on TARGET with SCOPE.
function(batchdist_stdlib_first target scope)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_link_options(${target} ${scope} "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
  endif()
endfunction()

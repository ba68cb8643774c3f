#pragma once
// Note [libstdc++ first] (launcher/torch_libraries.cmake): a pip LibTorch's
// libtorch_cpu.so exports a private copy of std::filesystem, and a call binds to
// the first definition in the process's load order. The link puts libstdc++.so.6
// first; this guard checks, at the start of main(), where std::filesystem really
// binds, and when it is not libstdc++.so.6 (a linker that did not keep the order,
// a program's own link line, an LD_PRELOAD) runs the process again, once, with
// libstdc++.so.6 preloaded: the same program, arguments and pid, before any
// thread, MPI or file exists. On an H200 node (torch 2.11.0, GCC 13) every
// std::filesystem::remove_all in torch's copy crashed.
//
// BATCHDIST_STDLIB_GUARD=off leaves the process as it is (the tests' control).

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace batchdist {

/// Where this process's calls of std::filesystem bind: the file of the first
/// definition of std::filesystem::remove_all in load order ("" when none is loaded).
inline std::string stdFilesystemProvider() {
  // remove_all(const path&, error_code&) as this build's ABI spells it.
#if _GLIBCXX_USE_CXX11_ABI
  void* sym = dlsym(RTLD_DEFAULT, "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code");
#else
  void* sym = dlsym(RTLD_DEFAULT, "_ZNSt10filesystem10remove_allERKNS_4pathERSt10error_code");
#endif
  Dl_info info{};
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

/// The path of the libstdc++.so.6 this process loaded ("" when none is).
inline std::string loadedLibstdcxx() {
  void* handle = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return "";
  struct link_map* map = nullptr;
  std::string path;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    path = map->l_name;
  }
  dlclose(handle);
  return path;
}

inline bool isLibstdcxx(const std::string& file) {
  const auto slash = file.rfind('/');
  return file.compare(slash == std::string::npos ? 0 : slash + 1, 10, "libstdc++.") == 0;
}

/// Whether `file` is this program's own executable (one linked with a static
/// libstdc++ provides std::filesystem itself: nothing to fix).
inline bool isThisProgram(const std::string& file) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return false;
  self[n] = '\0';
  char* real = realpath(file.c_str(), nullptr);
  const bool same = real != nullptr && std::strcmp(real, self) == 0;
  std::free(real);
  return same;
}

/// This process's arguments as the kernel holds them (argv[0] first), whatever
/// main() was handed.
inline std::vector<std::string> processArguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < cmdline.size();) {
    const size_t end = cmdline.find('\0', at);
    args.push_back(cmdline.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return args;
}

/// The guard: returns when std::filesystem binds to libstdc++.so.6 (or nothing
/// provides it), else re-executes the process with libstdc++.so.6 first in
/// LD_PRELOAD. A second start that still binds elsewhere, or a failed exec, warns on
/// stderr and goes on.
inline void ensureSystemStdlib() {
  const char* mode = std::getenv("BATCHDIST_STDLIB_GUARD");
  if (mode != nullptr && std::strcmp(mode, "off") == 0) return;
  const std::string provider = stdFilesystemProvider();
  if (provider.empty() || isLibstdcxx(provider) || isThisProgram(provider)) return;
  const std::string stdlib = loadedLibstdcxx();
  const bool again = mode != nullptr && std::strcmp(mode, "restarted") == 0;
  if (stdlib.empty() || again) {
    std::fprintf(stderr,
                 "batchdist: warning: std::filesystem binds to %s, not to libstdc++.so.6%s; "
                 "file operations may crash (Note [libstdc++ first]: LD_PRELOAD=%s)\n",
                 provider.c_str(), again ? " even with it preloaded" : "",
                 stdlib.empty() ? "<libstdc++.so.6>" : stdlib.c_str());
    return;
  }
  std::vector<std::string> args = processArguments();
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const char* preload = std::getenv("LD_PRELOAD");
  std::string list = stdlib;
  if (preload != nullptr && *preload != '\0') list.append(":").append(preload);
  setenv("LD_PRELOAD", list.c_str(), 1);
  setenv("BATCHDIST_STDLIB_GUARD", "restarted", 1);
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "batchdist: warning: std::filesystem binds to %s; restarting with LD_PRELOAD=%s failed: %s\n",
               provider.c_str(), stdlib.c_str(), std::strerror(errno));
}

}  // namespace batchdist

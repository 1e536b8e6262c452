// Loading libnccl.so.2 at run time (see nccl_library.hpp for why).
#include "08_context_parallel/nccl_library.hpp"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace flashstep::stages::context_parallel {

namespace {

struct Loaded {
  NcclLibrary library{};
  bool ok = false;
  std::string why;
};

template <typename F>
bool bind(void* handle, const char* name, F& slot, std::string& why) {
  slot = reinterpret_cast<F>(dlsym(handle, name));
  if (!slot) why = std::string("libnccl.so.2 has no ") + name;
  return slot != nullptr;
}

Loaded load() {
  Loaded l;
  void* handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  std::string first = handle ? "" : dlerror();
#ifdef FLASHSTEP_NCCL_LIBRARY
  if (!handle) handle = dlopen(FLASHSTEP_NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
#endif
  if (!handle) {
    l.why = "NCCL's runtime libnccl.so.2 could not be loaded (" + first +
            "); put the folder that holds it on LD_LIBRARY_PATH (scripts/gpu-cp.sh finds the one "
            "of the Python package nvidia-nccl-cu13)";
    return l;
  }
  NcclLibrary& n = l.library;
  l.ok = bind(handle, "ncclGetVersion", n.GetVersion, l.why) && bind(handle, "ncclGetUniqueId", n.GetUniqueId, l.why) &&
         bind(handle, "ncclCommInitRank", n.CommInitRank, l.why) &&
         bind(handle, "ncclCommDestroy", n.CommDestroy, l.why) && bind(handle, "ncclCommAbort", n.CommAbort, l.why) &&
         bind(handle, "ncclGetErrorString", n.GetErrorString, l.why) &&
         bind(handle, "ncclGetLastError", n.GetLastError, l.why) && bind(handle, "ncclAllGather", n.AllGather, l.why) &&
         bind(handle, "ncclBroadcast", n.Broadcast, l.why) && bind(handle, "ncclSend", n.Send, l.why) &&
         bind(handle, "ncclRecv", n.Recv, l.why) && bind(handle, "ncclGroupStart", n.GroupStart, l.why) &&
         bind(handle, "ncclGroupEnd", n.GroupEnd, l.why);
  return l;
}

const Loaded& loaded() {
  static std::once_flag once;
  static Loaded l;
  std::call_once(once, [] { l = load(); });
  return l;
}

}  // namespace

const NcclLibrary* nccl_library(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.library : nullptr;
}

const NcclLibrary& nccl() {
  std::string why;
  const NcclLibrary* n = nccl_library(&why);
  if (!n) throw std::runtime_error(why);
  return *n;
}

std::string nccl_version() {
  const NcclLibrary* n = nccl_library();
  int v = 0;
  if (!n || n->GetVersion(&v) != ncclSuccess) return "not loaded";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

void nccl_check(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  throw std::runtime_error(std::string(what) + " failed: " + nccl().GetErrorString(result));
}

}  // namespace flashstep::stages::context_parallel

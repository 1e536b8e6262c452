/// \file nccl_library.hpp
/// \brief The NCCL functions stage 08 calls, loaded from libnccl.so.2 when first needed.
///
/// The build needs only nccl.h (its types); the library is opened at run time (dlopen):
/// first by its soname, so LD_LIBRARY_PATH or the system's loader path decide (a GPU
/// machine may have NCCL only inside a Python package, nvidia-nccl-cu13, which
/// scripts/gpu-cp.sh finds), then at the path CMake found. A program that cannot load
/// it can then say so and skip, instead of failing to start. Only what the stage uses is
/// here; every call is the NCCL function of the same name (https://docs.nvidia.com/
/// deeplearning/nccl/user-guide/docs/api.html).
#pragma once

#include <nccl.h>

#include <string>

namespace flashstep::stages::context_parallel {

/// Pointers to the NCCL entry points the stage calls.
struct NcclLibrary {
  ncclResult_t (*GetVersion)(int* version);
  ncclResult_t (*GetUniqueId)(ncclUniqueId* id);
  ncclResult_t (*CommInitRank)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
  ncclResult_t (*CommDestroy)(ncclComm_t comm);
  ncclResult_t (*CommAbort)(ncclComm_t comm);
  const char* (*GetErrorString)(ncclResult_t result);
  const char* (*GetLastError)(ncclComm_t comm);
  ncclResult_t (*AllGather)(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*Broadcast)(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*Send)(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);
  ncclResult_t (*Recv)(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
};

/// The loaded library, or null when libnccl.so.2 cannot be opened (then `why` says what
/// the loader reported and where to point LD_LIBRARY_PATH). Loads once per process.
const NcclLibrary* nccl_library(std::string* why = nullptr);

/// The loaded library; throws std::runtime_error with the loader's message when absent.
const NcclLibrary& nccl();

/// "2.28.9" for the loaded library, or "not loaded".
std::string nccl_version();

/// Throws std::runtime_error naming `what` and NCCL's message when `result` is an error.
void nccl_check(ncclResult_t result, const char* what);

}  // namespace flashstep::stages::context_parallel

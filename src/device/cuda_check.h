// CUDA return codes as krug::Error: every runtime call goes through check(), which names the
// call and the device in the message (the only feedback a user on a GPU machine may get).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace krug::device {

// Throws krug::Error "<call> on CUDA device <d>: <CUDA's name and message>" unless ok.
void check(cudaError_t status, const char* call, int device = -1);

}  // namespace krug::device

// device_radix_sort.cuh — cub::DeviceRadixSort::SortPairs on the emulated device (cuda_runtime.h):
// a stable sort of (key, value) pairs by the key's bits [begin_bit, end_bit), signed keys in
// numeric order, queued on the stream; with no temporary storage it only sizes it, as cub does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cub {

struct DeviceRadixSort {
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const int32_t* d_keys_in,
                               int32_t* d_keys_out, const int32_t* d_values_in, int32_t* d_values_out, int num_items,
                               int begin_bit = 0, int end_bit = 32, cudaStream_t stream = nullptr);
};

}  // namespace cub

/* What scripts/kernel-table.py compiles for sm_90 to read the kernels' code off (registers,
 * shared and local memory, the inner loop's instructions and loads): every kernel of the CUDA
 * backend as cuda/kernels.cu instantiates it, and the model's micro-kernels. Not part of any
 * build target. */
#include "../../cuda/kernels.cu"
#include "kmodel_micro.cuh"

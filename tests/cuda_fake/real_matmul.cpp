/* cuda/matmul.cu, unchanged, compiled by the host C++ compiler against the fake CUDA runtime
 * (tests/cuda_fake/include first on the include path). */
#include "../../cuda/matmul.cu"

# translate.cmake — a kernels/*.cu source for the host compiler and the emulated device
# (include/cuda_runtime.h): every launch `kernel<<<grid, block, smem, stream>>>(args)` becomes
# `::piper::cuda_emulator::Launch(grid, block, smem, stream).run("kernel", kernel, args)`, and every
# `extern __shared__ T name[];` (or `extern __shared__ __align__(N) T name[];`) the block's dynamic
# shared memory as T*. Lines keep their numbers (#line), so compiler and sanitizer reports name the
# .cu file's lines.
# A template kernel is launched with its template arguments (`k<T><<<...>>>`): the launch takes the
# kernel's address.
# Usage: cmake -DIN=kernels/x.cu -DOUT=build/.../x.cpp -P translate.cmake
file(READ "${IN}" text)
set(launch "([A-Za-z_][A-Za-z0-9_]*(<[^<>;\n]*>)?)<<<([^\n]*)>>>\\(")
string(REGEX MATCHALL "${launch}" launches "${text}")
string(REGEX REPLACE "${launch}" "::piper::cuda_emulator::Launch(\\3).run(\"\\1\", \\1, " text "${text}")
string(REGEX REPLACE "extern __shared__ (__align__\\([0-9]+\\) )?([A-Za-z_][A-Za-z0-9_]*) ([A-Za-z_][A-Za-z0-9_]*)\\[\\];"
       "\\2* \\3 = ::piper::cuda_emulator::dynamic_shared<\\2>();" text "${text}")
if(text MATCHES "<<<|extern __shared__")
  message(FATAL_ERROR "${IN}: a kernel launch or dynamic shared array that translate.cmake does not take "
                      "(a launch is `name<<<...>>>(` on one line, an array `extern __shared__ [__align__(N)] T name[];`)")
endif()
file(WRITE "${OUT}" "#line 1 \"${IN}\"\n${text}")

// python/vemesh_py/bench_py.h
//
// vemesh._cpp_all_reduce_loop: the C++ side of bench/python_overhead.py.

#ifndef VEMESH_PYTHON_BENCH_PY_H_
#define VEMESH_PYTHON_BENCH_PY_H_

#include <pybind11/pybind11.h>

namespace vemesh::python {

void RegisterBench(pybind11::module_& m);

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_BENCH_PY_H_

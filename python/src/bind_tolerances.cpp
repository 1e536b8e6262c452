// The validation harness's tolerance table (stages/harness/compare.cpp), read from the
// harness itself so that the numbers flashstep.compare applies are the ones the GPU tests
// and `flashstep validate` apply. Compiled in where python/CMakeLists.txt finds the CUDA
// toolkit (stages/stage.hpp names CUDA runtime types); elsewhere the module has no table.
#include "bindings.hpp"
#include "flashstep/reference/errors.hpp"

#ifdef FLASHSTEP_PY_HAVE_TOLERANCES
#include "harness/compare.hpp"
#endif

namespace flashstep::python {

#ifdef FLASHSTEP_PY_HAVE_TOLERANCES
namespace {

namespace st = flashstep::stages;

py::tuple as_tuple(const st::harness::Tolerance& t) { return py::make_tuple(t.atol, t.rtol, t.norm); }

}  // namespace

void bind_tolerances(py::module_& m) {
  m.def(
      "tolerance_table",
      [] {
        py::list rows;
        for (const st::harness::DTypeTolerance& row : st::harness::tolerance_table()) {
          py::dict d;
          d["dtype"] = st::to_string(row.dtype);
          d["kv_dtype"] = st::to_string(row.kv_dtype);
          d["o"] = as_tuple(row.o);
          d["lse"] = as_tuple(row.lse);
          d["why"] = row.why;
          rows.append(d);
        }
        return rows;
      },
      R"doc(The validation harness's tolerance table, one dict per row.

Each row: dtype (q and o: "f32", "f16", "bf16"), kv_dtype (K/V: the same, or "e4m3" /
"e5m2" for an FP8 cache), o and lse as (atol, rtol, norm), and why (where the error
budget comes from). An output passes when every element is within atol + rtol * |ref|
and ||out - ref|| <= norm * ||ref||. stages/harness/compare.cpp holds the table.)doc");
  m.def(
      "tolerance",
      [](const std::string& dtype, const std::string& which, const py::object& kv_dtype) {
        const char* fn = "tolerance";
        if (which != "o" && which != "lse")
          throw ref::InvalidArgument(std::string(fn) + ": which must be \"o\" or \"lse\"; got \"" + which + "\"");
        const st::DType q = st::parse_dtype(dtype);
        const st::DType kv = kv_dtype.is_none() ? q : st::parse_dtype(py::str(kv_dtype));
        const st::harness::DTypeTolerance& row = st::harness::tolerance_for(q, kv);
        return as_tuple(which == "o" ? row.o : row.lse);
      },
      py::arg("dtype"), py::arg("which") = "o", py::arg("kv_dtype") = py::none(),
      R"doc(The harness's (atol, rtol, norm) for q and o in `dtype` ("float32", "float16",
"bfloat16" or f32/f16/bf16), K/V in `kv_dtype` (None: `dtype`; "float8_e4m3fn" /
"float8_e5m2" for an FP8 cache) and `which` ("o" or "lse").)doc");
}

#else

void bind_tolerances(py::module_&) {}  // no harness in this build: flashstep.compare says so

#endif

}  // namespace flashstep::python

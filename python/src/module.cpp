// The `flashstep._flashstep` extension: the CPU reference exposed under FlashInfer's names.
#include "bindings.hpp"

#include "flashstep/reference/errors.hpp"

PYBIND11_MODULE(_flashstep, m) {
  namespace fp = flashstep::python;
  m.doc() =
      "flashstep CPU reference (double precision). Names and arguments follow FlashInfer; "
      "results are float64 numpy arrays; invalid arguments raise ValueError.";
  // InvalidArgument derives from std::invalid_argument, which pybind11 maps to ValueError.
  fp::bind_attention(m);
  fp::bind_merge(m);
  fp::bind_kv_cache(m);
  fp::bind_structures(m);
  fp::bind_sampling(m);
  fp::bind_decoder(m);
  fp::bind_rope(m);
  fp::bind_mla(m);
  fp::bind_tolerances(m);
  // Later topics add one line each here.
}

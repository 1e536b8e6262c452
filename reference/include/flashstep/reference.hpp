/// \file reference.hpp
/// \brief Umbrella header: `#include <flashstep/reference.hpp>` gives the whole CPU reference.
#pragma once

#include "flashstep/reference/attention.hpp"  // IWYU pragma: export
#include "flashstep/reference/errors.hpp"     // IWYU pragma: export
#include "flashstep/reference/kv_cache.hpp"   // IWYU pragma: export
#include "flashstep/reference/merge.hpp"      // IWYU pragma: export
#include "flashstep/reference/tensor.hpp"     // IWYU pragma: export
// Topics added by later work register themselves here, one line each.
#include "flashstep/reference/page_allocator.hpp"  // IWYU pragma: export
#include "flashstep/reference/radix_cache.hpp"     // IWYU pragma: export
#include "flashstep/reference/block_sparse.hpp"    // IWYU pragma: export
#include "flashstep/reference/sampling.hpp"        // IWYU pragma: export
#include "flashstep/reference/cascade.hpp"         // IWYU pragma: export
#include "flashstep/reference/split_plan.hpp"      // IWYU pragma: export
#include "flashstep/reference/speculative.hpp"     // IWYU pragma: export
#include "flashstep/reference/tiny_decoder.hpp"    // IWYU pragma: export
#include "flashstep/reference/fp8.hpp"             // IWYU pragma: export
#include "flashstep/reference/rope.hpp"            // IWYU pragma: export
#include "flashstep/reference/rope_fp32.hpp"       // IWYU pragma: export
#include "flashstep/reference/mla.hpp"             // IWYU pragma: export

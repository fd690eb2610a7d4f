#pragma once

#include <memory>

#include "backends/model/detokenizer.hpp"
#include "text/tokenizer.hpp"

namespace rlforge::backends {

/// The `detokenizer` of a loaded rlforge::text tokenizer: its streams are
/// `text::stream_decoder`s that keep special tokens. The result shares `tok`'s loaded state.
/// Only in builds with rlforge::text (not RLFORGE_MINIMAL_DEPS).
std::shared_ptr<const detokenizer> make_detokenizer(text::tokenizer tok);

} // namespace rlforge::backends

#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tinker/loss_catalog.hpp"
#include "tinker/types.hpp"

/// The one semantic check of Tinker requests against the model that computes them (std only).
/// The service decodes bodies (syntax only); the backend calls these once, before anything
/// runs. A training request that passed is a `checked_request`, which the workers compute on
/// without checking again.
namespace rlforge::tinker {

/// What a model accepts.
struct model_limits {
  int64_t vocab_size = 0;         ///< token ids lie in [0, vocab_size)
  int64_t max_context_length = 0; ///< tokens one sequence may hold
};

/// Checks the datums of one `forward_backward` / `forward` request for `loss` (resolved for the
/// model's role) against `limits`. `where` starts every message (e.g. "forward_backward(m)
/// request 0 (seq_id 3)"), followed by the datum index, the input name and the position.
/// Throws `request_error` (user) for: no datums; a datum without tokens, whose
/// input + 1 target tokens exceed the context, or with a token id outside [0, vocab_size);
/// an unknown `loss_fn_inputs` name (listing the accepted ones); a missing input the loss needs;
/// `target_tokens` that are not integers, or other inputs that are not floating point; an input
/// that is not 1-D with one value per input token, or whose data disagrees with its shape; a
/// target id that is negative or outside the vocabulary; a non-finite value. Any finite weight
/// is accepted, negative ones too (SDK 0.25's `forward_backward_custom` sends -dLoss/dlogprob).
/// Targets need not be the shifted inputs: a datum is scored on its `target_tokens`.
void check_datums(const std::vector<datum>& data, const resolved_loss& loss,
                  const model_limits& limits, const std::string& where);

class checked_request;

/// Checks one `forward_backward` / `forward` request for a model of `role` with `limits`: its
/// loss (`resolve_loss`) and its datums (`check_datums`), with `where` starting every message.
/// Throws `request_error` (user) as they do. What passed is the request the workers compute on.
checked_request check_request(const forward_backward_request& request, model_role role,
                              const model_limits& limits, const std::string& where);

/// A `forward_backward` / `forward` request that passed `check_request`: its datums, its loss
/// resolved for the model, and whether it computes gradients. It is the one value a Tinker
/// training request travels as from the backend to the workers (runtime/messages.hpp puts it on
/// the wire), and the workers build their tensors from it without checking again. Only
/// `check_request` and `slice` make a non-empty one, so a malformed one can only come from our
/// own code (or a message another rlforge process built). Immutable once made; safe to share
/// between threads.
class checked_request {
public:
  /// An empty request (no datums): what the message deserializer fills in.
  checked_request() = default;

  const std::string& model_id() const { return model_id_; }
  const std::vector<datum>& data() const { return data_; }
  const resolved_loss& loss() const { return loss_; }
  bool forward_only() const { return forward_only_; }

  /// Datums [begin, end) as a request of their own, with the same loss (what one data-parallel
  /// rank computes). Clamped to the datums there are, so it may be empty.
  checked_request slice(size_t begin, size_t end) const;

private:
  friend checked_request check_request(const forward_backward_request&, model_role,
                                       const model_limits&, const std::string&);
  /// CAF's inspection, defined in runtime/messages.hpp (this library has no CAF).
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, checked_request& x);

  std::string model_id_;
  std::vector<datum> data_;
  resolved_loss loss_;
  bool forward_only_ = false;
};

inline bool operator==(const checked_request& a, const checked_request& b) {
  return a.model_id() == b.model_id() && a.data() == b.data() && a.loss() == b.loss() &&
         a.forward_only() == b.forward_only();
}

/// Checks one sample request against `limits`, with `where` starting the messages: an empty
/// prompt or one with an id outside the vocabulary; `max_tokens` < 1 or a prompt + max_tokens
/// beyond the context (naming both lengths and the context); num_samples < 1; first_sample < 0;
/// temperature not finite or < 0; top_p outside (0, 1]; top_k other than -1 or >= 1; a stop token
/// outside the vocabulary; an empty stop string; topk_prompt_logprobs outside
/// [0, vocab_size]; a continuation (`generated`) with num_samples other than 1, of max_tokens
/// tokens or more, or with an id outside the vocabulary. Throws `request_error` (user).
void check_sample(const sample_request& request, const model_limits& limits,
                  const std::string& where);

} // namespace rlforge::tinker

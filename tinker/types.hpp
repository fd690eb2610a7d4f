#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tinker/error.hpp"

/// Plain C++ request/response types of the Tinker-compatible training service (std only: no
/// CAF, no torch). The HTTP layer (service/) decodes request bodies into them and encodes the
/// results; an `actors::tinker_backend` computes on them. Plain data: no invariants beyond the
/// field comments; `tinker/datum_check.hpp` validates a request against a model.
namespace rlforge::tinker {

/// Element type of a Tinker `TensorData`.
enum class dtype { float32, int64, int32, bfloat16 };

/// Wire name of a dtype: "float32", "int64", "int32", "bfloat16".
const char* to_string(dtype x) noexcept;

/// Parses a wire name (see `to_string`, exact spelling). Throws `request_error` (category
/// "user") naming the string and the accepted names.
dtype parse_dtype(std::string_view name);

/// True for the floating-point dtypes (float32, bfloat16), whose elements live in `floats`.
bool is_floating(dtype x) noexcept;

/// A dense tensor of a request or a result. Floating elements (float32/bfloat16) are held in
/// `floats`, integer elements (int64/int32) in `ints`; the other vector is empty. Row-major;
/// an empty shape is a scalar of one element.
struct tensor_data {
  dtype type = dtype::float32;
  std::vector<int64_t> shape;
  std::vector<double> floats; ///< float32 / bfloat16 elements
  std::vector<int64_t> ints;  ///< int64 / int32 elements
  /// Product of `shape` (1 for a scalar); not the length of the data vectors.
  int64_t numel() const;
};

inline bool operator==(const tensor_data& a, const tensor_data& b) {
  return a.type == b.type && a.shape == b.shape && a.floats == b.floats && a.ints == b.ints;
}

/// One training example: the model input tokens and the loss inputs (`target_tokens`,
/// `weights`, `logprobs`, `advantages`, `values`, `returns`, ...).
struct datum {
  std::vector<int64_t> tokens; ///< all model_input chunks concatenated
  std::map<std::string, tensor_data> loss_fn_inputs;
};

inline bool operator==(const datum& a, const datum& b) {
  return a.tokens == b.tokens && a.loss_fn_inputs == b.loss_fn_inputs;
}

/// `forward_backward` / `forward` of one model (`forward_only` = no gradients).
struct forward_backward_request {
  std::string model_id;
  int64_t seq_id = 0;
  std::vector<datum> data;
  std::string loss_fn;
  std::map<std::string, double> loss_fn_config;
  bool forward_only = false;
};

/// Result of one `forward_backward_request`.
struct forward_backward_output {
  std::string loss_fn_output_type = "ArrayRecord";
  std::vector<std::map<std::string, tensor_data>> loss_fn_outputs; ///< one map per datum
  std::map<std::string, double> metrics; ///< keys "name:reduction", e.g. "loss:sum"
};

/// AdamW hyper-parameters of one optimizer step: Tinker's `AdamParams` with its defaults, and the
/// one representation of them everywhere (the service's bodies, the optimizer in backends/, the
/// `optim_step` message to the workers). In that message a negative `learning_rate` means "the
/// worker's own rate" (its schedule, or the last `set_lr`). Validity is checked where it is used
/// (`backends::validate`).
struct adam_params {
  double learning_rate = 1e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-12, weight_decay = 0,
         grad_clip_norm = 0; ///< 0 = no clipping
};

inline bool operator==(const adam_params& a, const adam_params& b) {
  return a.learning_rate == b.learning_rate && a.beta1 == b.beta1 && a.beta2 == b.beta2 &&
         a.eps == b.eps && a.weight_decay == b.weight_decay && a.grad_clip_norm == b.grad_clip_norm;
}
inline bool operator!=(const adam_params& a, const adam_params& b) {
  return !(a == b);
}

/// Tinker `LoraConfig`; `rank` 0 = full fine-tuning of the trained parts.
struct lora_config {
  int64_t rank = 0;
  bool has_seed = false;
  int64_t seed = 0;
  bool train_unembed = true, train_mlp = true, train_attn = true;
};

/// Tinker `SamplingParams`; `top_k` -1 = off, `temperature` 0 = greedy.
struct sampling_params {
  int64_t max_tokens = 0;
  bool has_seed = false;
  int64_t seed = 0;
  std::vector<int64_t> stop_tokens;
  std::vector<std::string> stop_strings;
  double temperature = 1;
  int64_t top_k = -1;
  double top_p = 1;
};

/// Where the files of a checkpoint are on the server (`dir`) and how clients know it (`name`,
/// "tinker://..."): messages name `name`, never `dir`.
struct checkpoint_ref {
  std::string dir;
  std::string name;
};

/// Which weights a sample request runs on.
struct sampler_ref {
  enum class kind {
    base,       ///< the server's base model
    snapshot,   ///< `model_id`'s weights as they were at its sampler save `version`
    checkpoint, ///< a persisted sampler checkpoint: the export in `dir`
  };
  kind type = kind::base;
  std::string model_id; ///< snapshot: the model whose weights were saved
  int64_t version = 0;  ///< snapshot: what `tinker_backend::save_sampler_snapshot` returned
  std::string dir;      ///< checkpoint: the server-side directory of the export
  /// How errors name this sampler to the client ("tinker://..." or the sampling session id);
  /// never a server path.
  std::string name;

  /// The engine this sampler runs on: "base", "model:<model_id>" (every snapshot of a model
  /// shares the model's engine) or "checkpoint:<dir>". The one key the scheduler's sampling
  /// lanes and the backend's engine grouping both use: requests with one key may share a call.
  std::string engine() const;
};

/// One `asample` call of a sampling session, or a slice of one: samples
/// `[first_sample, first_sample + num_samples)` of the call (the scheduler runs a large call in
/// slices; sample j's random stream depends only on the seed and j).
struct sample_request {
  std::string sampling_session_id;
  int64_t seq_id = 0;
  std::vector<int64_t> prompt;
  int64_t num_samples = 1;
  int64_t first_sample = 0;
  sampling_params params;
  bool prompt_logprobs = false;
  int64_t topk_prompt_logprobs = 0;
  sampler_ref sampler; ///< which weights (set by the service from the session or path)
  /// A continuation, set by the service when it streams a sample in chunks (never on the Tinker
  /// wire): the tokens sample `first_sample` (num_samples must be 1) generated in earlier calls.
  /// The call returns only the tokens that follow them, the ones the uninterrupted sample would
  /// have drawn next (same seed stream); they count towards `params.max_tokens`.
  std::vector<int64_t> generated;
};

/// One generated sequence: tokens and the log-prob of each (same length).
struct sampled_sequence {
  std::string stop_reason; ///< "stop" | "length"
  std::vector<int64_t> tokens;
  std::vector<double> logprobs;
};

/// Result of one `sample_request`: `num_samples` sequences.
struct sample_response {
  std::vector<sampled_sequence> sequences;
  bool has_prompt_logprobs = false;
  std::vector<double> prompt_logprobs; ///< one per prompt token; NaN at position 0
  /// k > 0 when the request asked for `topk_prompt_logprobs` = k: `topk_prompt_ids` and
  /// `topk_prompt_logprobs` are prompt_length x k row-major, row i the k most likely tokens at
  /// prompt position i (most likely first, ties by lower id) and their log-probs under the raw
  /// model distribution; row 0 (nothing predicts the first token) holds the empty cells, token 0
  /// and log-prob -99999 (the SDK's sentinel).
  int64_t topk = 0;
  std::vector<int64_t> topk_prompt_ids;
  std::vector<double> topk_prompt_logprobs;
};

/// The log-prob of an empty top-k cell (row 0 of `sample_response::topk_prompt_*`).
inline constexpr double topk_empty_logprob = -99999.0;

} // namespace rlforge::tinker

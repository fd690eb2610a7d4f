#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tinker/loss_catalog.hpp"
#include "tinker/types.hpp"

/// The JSON bodies of the Tinker API other than forward_backward and asample (TINKER-WIRE.md),
/// decoded into plain structs. JSON decoders follow the SDK's pydantic dumps: `null` is the same
/// as an absent field, unknown fields are ignored (newer SDKs add some), integer fields must be
/// JSON integers, number fields accept integers, and a `"type"` discriminator, when present, must
/// name the endpoint. Reentrant.
namespace rlforge::service {

/// `create_session`: `{tags, user_metadata, sdk_version, project_id?}`.
struct create_session_request {
  std::vector<std::string> tags;
  std::map<std::string, std::string> user_metadata; ///< non-string values as their JSON text
  std::string sdk_version;
  std::string project_id;
};

/// `session_heartbeat`: `{session_id}`.
struct session_heartbeat_request {
  std::string session_id;
};

/// `create_model`: `{session_id, model_seq_id, base_model, lora_config?, user_metadata?,
/// model_role?}`; without lora_config the rank is 0.
struct create_model_request {
  std::string session_id;
  int64_t model_seq_id = 0;
  std::string base_model;
  tinker::lora_config lora;
  tinker::model_role role = tinker::model_role::policy; ///< rlforge's `model_role`
  std::map<std::string, std::string> user_metadata;
};

/// `optim_step`: `{adam_params, model_id, seq_id}`.
struct optim_step_request {
  std::string model_id;
  int64_t seq_id = 0;
  tinker::adam_params adam;
};

/// `save_weights` (`save_state`): `{model_id, seq_id, path?, ttl_seconds?, overwrite?}`.
struct save_weights_request {
  std::string model_id;
  int64_t seq_id = 0;
  std::string path; ///< checkpoint name; empty = the server chooses one
  bool has_ttl = false;
  int64_t ttl_seconds = 0;
  bool overwrite = false;
};

/// `save_weights_for_sampler`: `{model_id, seq_id, path?, sampling_session_seq_id?,
/// ttl_seconds?}`. With a path the weights persist under that name; without, the SDK wants a
/// sampling session (`sampling_session_seq_id`).
struct save_weights_for_sampler_request {
  std::string model_id;
  int64_t seq_id = 0;
  std::string path;
  bool has_sampling_session_seq_id = false;
  int64_t sampling_session_seq_id = 0;
  bool has_ttl = false;
  int64_t ttl_seconds = 0;
};

/// `load_weights`: either legacy addressing `{model_id, seq_id, path, optimizer}` or
/// create-via-load `{session_id, model_seq_id, base_model?, user_metadata?, path, optimizer}`.
struct load_weights_request {
  bool create_via_load = false; ///< true: session_id + model_seq_id address a new model
  std::string model_id;
  int64_t seq_id = 0;
  std::string session_id;
  int64_t model_seq_id = 0;
  std::string base_model;
  std::map<std::string, std::string> user_metadata;
  std::string path; ///< "tinker://..."
  bool optimizer = false;
  std::string weights_access_token;
};

/// `create_sampling_session`: `{session_id, sampling_session_seq_id, model_path?, base_model?}`.
struct create_sampling_session_request {
  std::string session_id;
  int64_t sampling_session_seq_id = 0;
  std::string model_path; ///< "tinker://...", empty = the base model
  std::string base_model;
};

/// `retrieve_future`: `{request_id, allow_metadata_only?}`.
struct retrieve_future_request {
  std::string request_id;
  bool allow_metadata_only = false;
};

/// `weights_info`: `{tinker_path}`.
struct weights_info_request {
  std::string tinker_path;
};

/// `get_info` and `unload_model`: `{model_id}`.
struct model_id_request {
  std::string model_id;
};

/// Decoders of the JSON bodies above. Each throws `request_error` ("user") naming the endpoint
/// and field for malformed JSON, a body that is not an object, a missing required field, a field
/// of the wrong JSON type, a wrong `type` discriminator, or a value out of its domain:
/// negative ids / seq_ids, an empty required string, a lora rank < 0, a model_role other than
/// policy/critic, adam_params that are not finite or out of range (learning_rate >= 0, beta1 and
/// beta2 in [0, 1), eps > 0, weight_decay >= 0, grad_clip_norm >= 0), ttl_seconds < 1, a
/// checkpoint name (`path` of save_weights / save_weights_for_sampler) that is not 1-128 of
/// [A-Za-z0-9._-] or starts with '.', a path / model_path / tinker_path not starting with
/// "tinker://", create_sampling_session with neither model_path nor base_model, and load_weights
/// mixing or lacking both addressing modes.
create_session_request decode_create_session(std::string_view body);
session_heartbeat_request decode_session_heartbeat(std::string_view body);
create_model_request decode_create_model(std::string_view body);
optim_step_request decode_optim_step(std::string_view body);
save_weights_request decode_save_weights(std::string_view body);
save_weights_for_sampler_request decode_save_weights_for_sampler(std::string_view body);
load_weights_request decode_load_weights(std::string_view body);
create_sampling_session_request decode_create_sampling_session(std::string_view body);
retrieve_future_request decode_retrieve_future(std::string_view body);
weights_info_request decode_weights_info(std::string_view body);
model_id_request decode_get_info(std::string_view body);
model_id_request decode_unload_model(std::string_view body);

} // namespace rlforge::service

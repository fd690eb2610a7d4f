#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace rlforge::service {

/// What went wrong in a `future_store` call, so that the HTTP layer can pick a status code.
enum class store_errc {
  not_found, ///< the id names no record (→ 404)
  conflict,  ///< the record exists in a state or shape that forbids the call (→ 409)
  invalid,   ///< a malformed argument: empty id, bad JSON, unknown enum value (→ 400)
  database   ///< SQLite failed, or the file is not a usable store (→ 500)
};

/// The one exception `future_store` throws. The message names the operation, the id or path and
/// the likely cause; the store stays usable after it (the failed statement changed nothing).
class store_error : public std::runtime_error {
public:
  store_error(store_errc code, const std::string& message);

  /// The kind of failure.
  store_errc code() const noexcept { return code_; }

private:
  store_errc code_;
};

/// State of a future: `pending` until `complete` or `fail` moves it, once, to a final state.
enum class future_state { pending, complete, failed };

/// "pending", "complete" or "failed".
const char* to_string(future_state x) noexcept;

/// Message stored in every future that was still pending when the store was reopened.
inline constexpr const char* restart_failure_message =
    "the server restarted while this request was pending; resubmit it";

/// One row of the futures table.
struct future_record {
  std::string request_id;
  std::string request_type;    ///< as given to `submit`, e.g. "forward_backward"
  std::string model_id;        ///< may be empty (requests not bound to a model)
  int64_t seq_id = -1;         ///< -1 when the request carries no sequence number
  std::string idempotency_key; ///< empty when the request carried none
  std::string payload_hash;
  future_state state = future_state::pending;
  std::string result;              ///< bytes given to `complete` (empty otherwise)
  std::string result_content_type; ///< content type given to `complete` (empty otherwise)
  std::string error;               ///< message given to `fail` (empty otherwise)
  std::string category;            ///< category given to `fail` (empty otherwise)
  int64_t created_ms = 0;          ///< Unix time in milliseconds
  int64_t completed_ms = 0;        ///< 0 while pending
};

/// Answer of `future_store::submit`.
struct submit_result {
  std::string request_id; ///< the new id, or the id of the original request for a retry
  bool created = false;   ///< true when a new pending future was inserted
  bool conflict = false;  ///< true when the key or (model_id, seq_id) was used by another payload
  std::string message;    ///< why, when `conflict` (request_id is then the earlier request's id)
};

/// One row of the sessions table.
struct session_record {
  std::string session_id;
  int64_t created_ms = 0;
  int64_t last_heartbeat_ms = 0;
  std::string tags_json = "[]";          ///< JSON text as the client sent it
  std::string user_metadata_json = "{}"; ///< JSON text as the client sent it
};

/// One row of the models table. `model_seq_id` is the client's counter within its session
/// (the model id is then `model_id_for(session_id, model_seq_id)`), -1 when unknown.
struct model_record {
  std::string model_id;
  std::string session_id;
  int64_t model_seq_id = -1;
  std::string base_model;
  std::string lora_config_json = "{}"; ///< JSON text (the create_model request's lora_config)
  std::string role = "policy";         ///< "policy" or "critic"
  std::string user_metadata_json = "{}";
  int64_t created_ms = 0; ///< set by `insert_model`
  bool deleted = false;   ///< set by `mark_model_deleted`
};

/// One row of the sampling_sessions table. A sampling session samples either a trained model
/// (`model_id`, optionally at the weights in `weights_dir`) or the base model (`model_id` empty).
struct sampling_session_record {
  std::string id;                       ///< chosen by `create_sampling_session`
  std::string session_id;               ///< may be empty (session-less clients)
  int64_t sampling_session_seq_id = -1; ///< the client's counter, -1 when unknown
  std::string model_id;                 ///< empty = the base model
  std::string base_model;
  std::string model_path; ///< the "tinker://..." path it was created from, or empty
  int64_t weights_version = 0;
  std::string weights_dir; ///< directory holding the weights, or empty
  int64_t created_ms = 0;  ///< set by `create_sampling_session`
};

/// Kind of a stored checkpoint: training state (`save_weights`) or sampler weights
/// (`save_weights_for_sampler`).
enum class checkpoint_kind { weights, sampler_weights };

/// "weights" or "sampler_weights".
const char* to_string(checkpoint_kind x) noexcept;

/// One row of the checkpoints table.
struct checkpoint_record {
  std::string tinker_path; ///< "tinker://...", the primary key
  std::string model_id;
  checkpoint_kind kind = checkpoint_kind::weights;
  std::string name; ///< the name the client gave (`path` of the save request)
  std::string dir;  ///< where the files are on disk
  int64_t size_bytes = 0;
  int64_t created_ms = 0;            ///< set by `insert_checkpoint` when 0
  std::optional<int64_t> expires_ms; ///< Unix ms after which it may be deleted; none = never
};

/// Persistent state of the Tinker-compatible service in one SQLite file: futures (submitted
/// requests and their results), sessions, models, sampling sessions and checkpoints.
///
/// The file is opened in WAL journal mode with `synchronous=NORMAL` (a committed call survives a
/// crash of the process; a power loss may lose the last few) and a busy timeout of 10 s, so other
/// processes may read it while the server runs. Every call is one transaction and returns only
/// after it committed.
///
/// Thread safety: every member function may be called from any thread at the same time; calls
/// are serialized on one connection.
class future_store {
public:
  /// Version of the schema this build writes; files with another version are refused.
  static constexpr int64_t schema_version = 1;

  /// Opens (creating when absent) the store at `path`, or an in-memory store for ":memory:".
  /// Creates the schema in a new file; refuses, with a `database` error naming the path and the
  /// cause, a file that is not SQLite, an SQLite file not written by this store, a store written
  /// with an unknown schema version, or a path that cannot be opened for writing. Then marks
  /// every future still pending (the server stopped while running it) as failed with
  /// `restart_failure_message` and category "server": pending requests are reported failed,
  /// never lost; `failed_at_open()` tells how many.
  static std::unique_ptr<future_store> open(const std::string& path);

  ~future_store();
  future_store(const future_store&) = delete;
  future_store& operator=(const future_store&) = delete;

  /// The path given to `open`.
  const std::string& path() const noexcept { return path_; }

  /// How many pending futures `open` turned into failures.
  size_t failed_at_open() const noexcept { return failed_at_open_; }

  // ---- futures ------------------------------------------------------------------------------

  /// Records a new pending request, or recognizes a retry of an earlier one:
  /// - a non-empty `idempotency_key` already stored with the same `payload_hash` → the earlier
  ///   request's id, `created == false`; with another hash → `conflict == true`;
  /// - otherwise, `seq_id >= 0` and (`model_id`, `seq_id`) already stored with the same hash →
  ///   the earlier id, `created == false`; with another hash → `conflict == true`;
  /// - otherwise a new pending future with a fresh id ("req-" + 32 random hex digits).
  /// Throws `invalid` for an empty `request_type` or `payload_hash`, or `seq_id < -1`.
  submit_result submit(const std::string& request_type, const std::string& model_id, int64_t seq_id,
                       const std::string& idempotency_key, const std::string& payload_hash);

  /// Stores `bytes` as the result of the pending future `request_id` and makes it complete.
  /// Throws `not_found` for an unknown id and `conflict` for a future that is already final.
  void complete(const std::string& request_id, const std::string& bytes,
                const std::string& content_type);

  /// Makes the pending future `request_id` failed with `message` and `category` ("user",
  /// "server" or "unknown", as the SDK's RequestFailedError expects). Throws `invalid` for
  /// another category, `not_found` and `conflict` as `complete`.
  void fail(const std::string& request_id, const std::string& message, const std::string& category);

  /// The future `request_id`, or none.
  std::optional<future_record> get(const std::string& request_id);

  /// How many futures are in `state`.
  size_t count_futures(future_state state);

  /// Deletes the complete and failed futures that finished before `before_ms` (Unix ms) and
  /// returns how many; pending ones are never deleted. A later `get` of a deleted id finds
  /// nothing (the server answers "expired"), and a retry of it is a new request.
  size_t purge_finished_futures(int64_t before_ms);

  // ---- sessions -----------------------------------------------------------------------------

  /// Creates a session ("sess-" + 32 random hex digits) with the given tags and user metadata
  /// (JSON text; empty means `[]` / `{}`) and returns its id. Throws `invalid` for text that is
  /// not JSON, or tags that are not an array / metadata that is not an object.
  std::string create_session(const std::string& tags_json = "[]",
                             const std::string& user_metadata_json = "{}");

  /// Sets the session's last heartbeat to now. Throws `not_found` for an unknown session.
  void heartbeat(const std::string& session_id);

  /// The session, or none.
  std::optional<session_record> get_session(const std::string& session_id);

  /// Every session, oldest first.
  std::vector<session_record> list_sessions();

  // ---- models -------------------------------------------------------------------------------

  /// The SDK's model id format: "<session_id>:train:<model_seq_id>".
  static std::string model_id_for(const std::string& session_id, int64_t model_seq_id);

  /// The id the next model of `session_id` gets: `model_id_for(session_id, n)` with n one past the
  /// largest `model_seq_id` of the session's models (0 for the first). Throws `not_found` for an
  /// unknown session.
  std::string next_model_id(const std::string& session_id);

  /// Inserts `model` (its `created_ms` is set to now, `deleted` to false). Throws `invalid` for
  /// an empty model id or base model, a role other than "policy"/"critic", or JSON fields that
  /// are not JSON objects; `not_found` for a non-empty `session_id` that names no session;
  /// `conflict` when the model id is taken (also by a deleted model: ids are never reused).
  void insert_model(const model_record& model);

  /// The model (deleted ones included, with `deleted == true`), or none.
  std::optional<model_record> get_model(const std::string& model_id);

  /// Models of `session_id` (all sessions when empty), oldest first; deleted ones only when
  /// `include_deleted`.
  std::vector<model_record> list_models(const std::string& session_id = "",
                                        bool include_deleted = false);

  /// Marks the model deleted. Throws `not_found` for an unknown model and `conflict` for one
  /// already deleted.
  void mark_model_deleted(const std::string& model_id);

  // ---- sampling sessions --------------------------------------------------------------------

  /// Creates a sampling session from `s` (its `id` and `created_ms` are chosen here: "samp-" + 32
  /// random hex digits) and returns the id. When `s.session_id` is non-empty and
  /// `s.sampling_session_seq_id >= 0` and that pair already names a sampling session (a retry),
  /// returns that session's id instead. Throws `invalid` when both `model_id` and `base_model`
  /// are empty or `weights_version < 0`, `not_found` for a non-empty `session_id` or `model_id`
  /// that names no session / model.
  std::string create_sampling_session(const sampling_session_record& s);

  /// The sampling session, or none.
  std::optional<sampling_session_record> get_sampling_session(const std::string& id);

  /// Sampling sessions created in `session_id` (the session-less ones when empty), oldest first.
  std::vector<sampling_session_record> list_sampling_sessions(const std::string& session_id);

  /// Points the sampling session at new weights. Throws `not_found` for an unknown id and
  /// `invalid` for a negative version.
  void update_sampling_weights(const std::string& id, int64_t weights_version,
                               const std::string& weights_dir);

  // ---- checkpoints --------------------------------------------------------------------------

  /// Inserts `c` (`created_ms` = now when 0). With `overwrite`, replaces a checkpoint with the
  /// same path; without, throws `conflict` naming the path. Throws `invalid` for a path not
  /// starting with "tinker://", an empty model id or dir, a negative size, or `expires_ms`
  /// earlier than `created_ms`.
  void insert_checkpoint(const checkpoint_record& c, bool overwrite = false);

  /// The checkpoint at `tinker_path`, or none.
  std::optional<checkpoint_record> get_checkpoint(const std::string& tinker_path);

  /// Checkpoints of `model_id` (every model's when empty), oldest first.
  std::vector<checkpoint_record> list_checkpoints(const std::string& model_id = "");

  /// Checkpoints whose `expires_ms` is set and <= `now_ms`, oldest first (for a cleaner that
  /// removes their directories and then calls `delete_checkpoint`).
  std::vector<checkpoint_record> list_expired_checkpoints(int64_t now_ms);

  /// Removes the checkpoint's row (not its files) and returns it. Throws `not_found` for an
  /// unknown path.
  checkpoint_record delete_checkpoint(const std::string& tinker_path);

  /// Wall-clock time in Unix milliseconds, as stored in `*_ms` fields.
  static int64_t now_ms();

  /// SQLite handles; defined in the source.
  struct connection;

private:
  future_store(std::string path, std::unique_ptr<connection> db);

  std::string path_;
  std::unique_ptr<connection> db_;
  size_t failed_at_open_ = 0;
  std::mutex mtx_;
};

} // namespace rlforge::service

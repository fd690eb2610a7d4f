#pragma once

// The SQLite plumbing of `future_store` (future_store.hpp), shared by its source files:
// future_store.cpp (open, futures, sessions) and future_store_models.cpp (models, sampling
// sessions, checkpoints). Internal: not part of the store's interface. Thread-safety: none of
// its own; every use holds `future_store::mtx_` (the connection is the store's).

#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>

#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include "service/future_store.hpp"
#include "strings/format.hpp"

namespace rlforge::service {

namespace store_detail {


[[noreturn]] inline void throw_error(store_errc code, const std::string& message) {
  throw store_error(code, "future_store: " + message);
}

/// Owns one prepared statement; the cache below keeps them for the connection's lifetime.
class statement {
public:
  statement(sqlite3* db, const std::string& sql) : db_(db) {
    if (sqlite3_prepare_v3(db, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr) !=
        SQLITE_OK) {
      std::string msg = sqlite3_errmsg(db);
      sqlite3_finalize(stmt_);
      throw_error(store_errc::database, "cannot prepare '" + sql + "': " + msg);
    }
  }
  ~statement() { sqlite3_finalize(stmt_); }
  statement(const statement&) = delete;
  statement& operator=(const statement&) = delete;

  sqlite3_stmt* get() const noexcept { return stmt_; }
  sqlite3* db() const noexcept { return db_; }

private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

/// One use of a cached statement: binds parameters, steps, reads columns, and resets the
/// statement (dropping its bindings) when it goes out of scope.
class query {
public:
  query(statement& s, const char* what) : s_(s), what_(what) {}
  ~query() {
    sqlite3_reset(s_.get());
    sqlite3_clear_bindings(s_.get());
  }
  query(const query&) = delete;
  query& operator=(const query&) = delete;

  query& bind(int i, const std::string& text) {
    check(sqlite3_bind_text(s_.get(), i, text.data(), static_cast<int>(text.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  query& bind(int i, const char* text) {
    check(sqlite3_bind_text(s_.get(), i, text, -1, SQLITE_TRANSIENT));
    return *this;
  }
  query& bind(int i, int64_t value) {
    check(sqlite3_bind_int64(s_.get(), i, value));
    return *this;
  }
  query& bind_blob(int i, const std::string& bytes) {
    // A zero-length blob must still be a blob, not NULL: pass a non-null pointer.
    static const char empty = 0;
    check(sqlite3_bind_blob64(s_.get(), i, bytes.empty() ? &empty : bytes.data(), bytes.size(),
                              SQLITE_TRANSIENT));
    return *this;
  }
  query& bind_null(int i) {
    check(sqlite3_bind_null(s_.get(), i));
    return *this;
  }
  /// Text or NULL (for an empty string).
  query& bind_optional(int i, const std::string& text) {
    return text.empty() ? bind_null(i) : bind(i, text);
  }

  /// Steps once: true when a row is available, false when done.
  bool step() {
    int rc = sqlite3_step(s_.get());
    if (rc == SQLITE_ROW)
      return true;
    if (rc == SQLITE_DONE)
      return false;
    fail(rc);
  }

  /// Steps a statement that returns no rows.
  void run() {
    while (step()) {
      // Statements run through `run` return no rows; drain them anyway.
    }
  }

  std::string text(int col) const {
    auto p = reinterpret_cast<const char*>(sqlite3_column_text(s_.get(), col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_.get(), col)))
             : std::string();
  }
  std::string blob(int col) const {
    auto p = static_cast<const char*>(sqlite3_column_blob(s_.get(), col));
    return p ? std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_.get(), col)))
             : std::string();
  }
  int64_t integer(int col) const { return sqlite3_column_int64(s_.get(), col); }
  bool is_null(int col) const { return sqlite3_column_type(s_.get(), col) == SQLITE_NULL; }

private:
  void check(int rc) {
    if (rc != SQLITE_OK)
      fail(rc);
  }
  [[noreturn]] void fail(int rc) {
    throw_error(store_errc::database, std::string(what_) + ": " + sqlite3_errmsg(s_.db()) + " (" +
                                          sqlite3_errstr(rc) + ")");
  }

  statement& s_;
  const char* what_;
};


inline future_state parse_state(const std::string& s) {
  if (s == "pending")
    return future_state::pending;
  if (s == "complete")
    return future_state::complete;
  if (s == "failed")
    return future_state::failed;
  throw_error(store_errc::database, "corrupt futures row: unknown state '" + s + "'");
}

inline checkpoint_kind parse_kind(const std::string& s) {
  if (s == "weights")
    return checkpoint_kind::weights;
  if (s == "sampler_weights")
    return checkpoint_kind::sampler_weights;
  throw_error(store_errc::database, "corrupt checkpoints row: unknown kind '" + s + "'");
}

/// `text` when it parses as JSON of the wanted shape (an empty string stands for `fallback`).
inline std::string checked_json(const std::string& text, bool want_array, const char* fallback,
                         const char* what) {
  if (text.empty())
    return fallback;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded())
    throw_error(store_errc::invalid, std::string(what) + " is not valid JSON: '" + text + "'");
  if (want_array ? !j.is_array() : !j.is_object())
    throw_error(store_errc::invalid, std::string(what) + " must be a JSON " +
                                         (want_array ? "array" : "object") + ", got '" + text +
                                         "'");
  return text;
}

} // namespace store_detail

/// The SQLite connection, its cached statements and the id generator; guarded by
/// `future_store::mtx_`.
struct future_store::connection {
  sqlite3* db = nullptr;
  std::map<std::string, std::unique_ptr<store_detail::statement>> statements;
  std::mt19937_64 rng;

  explicit connection(sqlite3* handle) : db(handle) {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    rng.seed(seq);
  }
  ~connection() {
    statements.clear(); // finalize every statement before closing
    sqlite3_close(db);
  }

  store_detail::statement& prepare(const std::string& sql) {
    auto& slot = statements[sql];
    if (!slot)
      slot = std::make_unique<store_detail::statement>(db, sql);
    return *slot;
  }

  /// Runs statements without parameters or results (schema, pragmas, BEGIN/COMMIT).
  void exec(const std::string& sql, const std::string& what) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : sqlite3_errmsg(db);
      sqlite3_free(err);
      store_detail::throw_error(store_errc::database, what + ": " + msg);
    }
  }

  /// `prefix` + 32 random hex digits (128 bits).
  std::string random_id(const char* prefix) {
    std::array<char, 33> hex{};
    std::snprintf(hex.data(), hex.size(), "%016llx%016llx", static_cast<unsigned long long>(rng()),
                  static_cast<unsigned long long>(rng()));
    return std::string(prefix) + hex.data();
  }
};

namespace store_detail {


/// BEGIN IMMEDIATE on construction, ROLLBACK on destruction unless `commit` ran.
class transaction {
public:
  explicit transaction(future_store::connection& c) : c_(c) {
    c_.exec("BEGIN IMMEDIATE", "begin transaction");
  }
  ~transaction() {
    if (!done_)
      sqlite3_exec(c_.db, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  transaction(const transaction&) = delete;
  transaction& operator=(const transaction&) = delete;

  void commit() {
    c_.exec("COMMIT", "commit transaction");
    done_ = true;
  }

private:
  future_store::connection& c_;
  bool done_ = false;
};

inline future_record read_future(query& q) {
  future_record r;
  r.request_id = q.text(0);
  r.request_type = q.text(1);
  r.model_id = q.text(2);
  r.seq_id = q.integer(3);
  r.idempotency_key = q.text(4);
  r.payload_hash = q.text(5);
  r.state = parse_state(q.text(6));
  r.result = q.blob(7);
  r.result_content_type = q.text(8);
  r.error = q.text(9);
  r.category = q.text(10);
  r.created_ms = q.integer(11);
  r.completed_ms = q.integer(12);
  return r;
}

inline constexpr const char* future_columns =
    "request_id, request_type, model_id, seq_id, idempotency_key, payload_hash, state, result, "
    "result_content_type, error, category, created_ms, completed_ms";

inline model_record read_model(query& q) {
  model_record m;
  m.model_id = q.text(0);
  m.session_id = q.text(1);
  m.model_seq_id = q.integer(2);
  m.base_model = q.text(3);
  m.lora_config_json = q.text(4);
  m.role = q.text(5);
  m.user_metadata_json = q.text(6);
  m.created_ms = q.integer(7);
  m.deleted = q.integer(8) != 0;
  return m;
}

inline constexpr const char* model_columns =
    "model_id, session_id, model_seq_id, base_model, lora_config, role, user_metadata, "
    "created_ms, deleted";

inline checkpoint_record read_checkpoint(query& q) {
  checkpoint_record c;
  c.tinker_path = q.text(0);
  c.model_id = q.text(1);
  c.kind = parse_kind(q.text(2));
  c.name = q.text(3);
  c.dir = q.text(4);
  c.size_bytes = q.integer(5);
  c.created_ms = q.integer(6);
  if (!q.is_null(7))
    c.expires_ms = q.integer(7);
  return c;
}

inline constexpr const char* checkpoint_columns =
    "tinker_path, model_id, kind, name, dir, size_bytes, created_ms, expires_ms";

using strings::in_quotes;

} // namespace store_detail

} // namespace rlforge::service

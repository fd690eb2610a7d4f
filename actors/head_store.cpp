// The head's registry and placement log in SQLite (head_store.hpp).
#include "actors/head_store.hpp"

#include <stdexcept>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#if RLFORGE_HEAD_STORE
#include <sqlite3.h>
#endif

namespace rlforge::actors {

#if RLFORGE_HEAD_STORE

namespace {

[[noreturn]] void fail(sqlite3* db, const std::string& path, const std::string& doing) {
  throw std::runtime_error("head state " + path + ": " + doing + ": " +
                           (db ? sqlite3_errmsg(db) : "out of memory"));
}

/// One prepared statement, finalized at scope exit.
struct stmt {
  sqlite3_stmt* s = nullptr;
  stmt(sqlite3* db, const std::string& path, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK)
      fail(db, path, std::string{"preparing '"} + sql + "'");
  }
  ~stmt() { sqlite3_finalize(s); }
  stmt(const stmt&) = delete;
  stmt& operator=(const stmt&) = delete;
};

} // namespace

struct head_store::impl {
  sqlite3* db = nullptr;
  ~impl() { sqlite3_close(db); }
};

head_store::head_store(const std::string& path) : path_(path), impl_(std::make_unique<impl>()) {
  if (sqlite3_open(path.c_str(), &impl_->db) != SQLITE_OK)
    fail(impl_->db, path_, "cannot open it");
  const char* schema =
      "PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;"
      "CREATE TABLE IF NOT EXISTS registry (id INTEGER PRIMARY KEY CHECK (id = 1), body BLOB);"
      "CREATE TABLE IF NOT EXISTS placement_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
      "kind TEXT NOT NULL, args BLOB NOT NULL);";
  char* err = nullptr;
  if (sqlite3_exec(impl_->db, schema, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string why = err ? err : "unknown error";
    sqlite3_free(err);
    throw std::runtime_error("head state " + path_ + ": not a head state file (" + why + ")");
  }
}

head_store::~head_store() = default;

std::optional<head_registry> head_store::registry() {
  stmt q{impl_->db, path_, "SELECT body FROM registry WHERE id = 1"};
  if (sqlite3_step(q.s) != SQLITE_ROW)
    return std::nullopt;
  const auto* p = static_cast<const char*>(sqlite3_column_blob(q.s, 0));
  std::vector<char> buf(p, p + sqlite3_column_bytes(q.s, 0));
  head_registry out;
  caf::binary_deserializer source{nullptr, buf};
  if (auto err = source(out))
    throw std::runtime_error("head state " + path_ +
                             ": its registry cannot be read back (written by another build?)");
  return out;
}

std::vector<placement_op> head_store::placement_log() {
  stmt q{impl_->db, path_, "SELECT kind, args FROM placement_log ORDER BY seq"};
  std::vector<placement_op> out;
  int rc = SQLITE_ROW;
  while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
    placement_op op;
    op.kind = reinterpret_cast<const char*>(sqlite3_column_text(q.s, 0));
    const auto* p = static_cast<const char*>(sqlite3_column_blob(q.s, 1));
    op.args.assign(p, p + sqlite3_column_bytes(q.s, 1));
    out.push_back(std::move(op));
  }
  if (rc != SQLITE_DONE)
    fail(impl_->db, path_, "reading the placement log");
  return out;
}

void head_store::save(const head_registry& registry) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  auto copy = registry; // inspect takes a mutable reference
  if (sink(copy))
    throw std::runtime_error("head state " + path_ + ": cannot encode the registry");
  stmt q{impl_->db, path_, "INSERT OR REPLACE INTO registry (id, body) VALUES (1, ?)"};
  sqlite3_bind_blob(q.s, 1, buf.data(), static_cast<int>(buf.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(q.s) != SQLITE_DONE)
    fail(impl_->db, path_, "saving the registry");
}

void head_store::append(const placement_op& op) {
  stmt q{impl_->db, path_, "INSERT INTO placement_log (kind, args) VALUES (?, ?)"};
  sqlite3_bind_text(q.s, 1, op.kind.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_blob(q.s, 2, op.args.data(), static_cast<int>(op.args.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(q.s) != SQLITE_DONE)
    fail(impl_->db, path_, "appending to the placement log");
}

#else // a build without SQLite (RLFORGE_MINIMAL_DEPS)

struct head_store::impl {};

head_store::head_store(const std::string& path) : path_(path) {
  throw std::runtime_error("head state " + path +
                           ": this build has no SQLite (RLFORGE_MINIMAL_DEPS); a head that keeps "
                           "its registry across restarts needs it");
}

head_store::~head_store() = default;
std::optional<head_registry> head_store::registry() { return std::nullopt; }
std::vector<placement_op> head_store::placement_log() { return {}; }
void head_store::save(const head_registry&) {}
void head_store::append(const placement_op&) {}

#endif

} // namespace rlforge::actors

#include "actors/rendezvous_store.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "backends/error.hpp"
#include "runtime/errc.hpp"
#include "strings/format.hpp"

namespace rlforge::actors {

namespace {

using bytes = std::vector<uint8_t>;

/// One caller waiting for keys: a `kv_wait` (answered true) or a `kv_get` (answered the value
/// of its single key).
struct waiter {
  std::vector<std::string> keys;
  std::optional<caf::typed_response_promise<bool>> all_set;
  std::optional<caf::typed_response_promise<bytes>> value;
  int64_t timeout_ms = 0;
};

struct store_state {
  std::map<std::string, bytes> kv;
  std::map<uint64_t, waiter> waiters; ///< by id, in arrival order
  uint64_t next_waiter = 1;
  static const char* name;
};

const char* store_state::name = "rendezvous_store";

using store_pointer = rendezvous_store_actor::stateful_pointer<store_state>;

bool all_set(const store_state& st, const std::vector<std::string>& keys) {
  for (auto& k : keys)
    if (st.kv.count(k) == 0)
      return false;
  return true;
}

/// Answers every waiter whose keys are now all set, oldest first.
void serve_waiters(store_pointer self) {
  auto& st = self->state;
  for (auto i = st.waiters.begin(); i != st.waiters.end();) {
    if (!all_set(st, i->second.keys)) {
      ++i;
      continue;
    }
    if (i->second.value)
      i->second.value->deliver(st.kv.at(i->second.keys.front()));
    else
      i->second.all_set->deliver(true);
    i = st.waiters.erase(i);
  }
}

caf::error bad_timeout(int64_t timeout_ms) {
  return make_error(errc::invalid_argument,
                    "rendezvous store: a wait's timeout must be > 0 ms, got "
                        + std::to_string(timeout_ms));
}

std::string key_list(const std::vector<std::string>& keys) {
  std::vector<std::string> quoted;
  for (auto& k : keys)
    quoted.push_back(strings::in_quotes(k));
  return strings::join(quoted, "none");
}

/// Parses the decimal integer `kv_add` keeps at a key.
std::optional<int64_t> as_integer(const bytes& value) {
  std::string text(value.begin(), value.end());
  if (text.empty())
    return std::nullopt;
  try {
    size_t used = 0;
    auto v = std::stoll(text, &used);
    if (used != text.size())
      return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

rendezvous_store_actor::behavior_type store_actor(store_pointer self, caf::actor owner) {
  if (owner) {
    self->monitor(owner);
    self->set_down_handler([=](caf::down_msg& m) {
      if (m.source == owner.address())
        self->quit();
    });
  }
  // Starts waiting for `w`'s keys; its timer fails it unless they arrive first.
  auto park = [=](waiter w) {
    auto id = self->state.next_waiter++;
    auto timeout = std::chrono::milliseconds{w.timeout_ms};
    self->state.waiters.emplace(id, std::move(w));
    self->delayed_send(self, timeout, kv_expire_atom::value, id);
  };
  return {
    [=](kv_set_atom, std::string& key, bytes& value) {
      self->state.kv[std::move(key)] = std::move(value);
      serve_waiters(self);
    },
    [=](kv_get_atom, std::string& key, int64_t timeout_ms) -> caf::result<bytes> {
      if (timeout_ms <= 0)
        return bad_timeout(timeout_ms);
      auto& st = self->state;
      if (auto i = st.kv.find(key); i != st.kv.end())
        return i->second;
      auto rp = self->make_response_promise<bytes>();
      waiter w;
      w.keys = {std::move(key)};
      w.value = rp;
      w.timeout_ms = timeout_ms;
      park(std::move(w));
      return rp;
    },
    [=](kv_add_atom, std::string& key, int64_t delta) -> caf::result<int64_t> {
      auto& st = self->state;
      int64_t sum = delta;
      if (auto i = st.kv.find(key); i != st.kv.end()) {
        auto old = as_integer(i->second);
        if (!old)
          return make_error(errc::invalid_argument, "rendezvous store: add to "
                                                        + strings::in_quotes(key)
                                                        + ", whose value is not an integer");
        sum += *old;
      }
      auto text = std::to_string(sum);
      st.kv[std::move(key)] = bytes(text.begin(), text.end());
      serve_waiters(self);
      return sum;
    },
    [=](kv_swap_atom, std::string& key, bytes& expected, bytes& desired) -> bytes {
      auto& kv = self->state.kv;
      auto i = kv.find(key);
      // c10d's rule: an absent key counts as holding the empty value.
      const bool matches = i == kv.end() ? expected.empty() : i->second == expected;
      if (!matches)
        return i == kv.end() ? expected : i->second;
      kv[key] = desired;
      serve_waiters(self);
      return desired;
    },
    [=](kv_check_atom, const std::vector<std::string>& keys) { return all_set(self->state, keys); },
    [=](kv_wait_atom, std::vector<std::string>& keys, int64_t timeout_ms) -> caf::result<bool> {
      if (timeout_ms <= 0)
        return bad_timeout(timeout_ms);
      if (all_set(self->state, keys))
        return true;
      auto rp = self->make_response_promise<bool>();
      waiter w;
      w.keys = std::move(keys);
      w.all_set = rp;
      w.timeout_ms = timeout_ms;
      park(std::move(w));
      return rp;
    },
    [=](kv_erase_atom, const std::string& key) { return self->state.kv.erase(key) > 0; },
    [=](kv_count_atom) { return static_cast<int64_t>(self->state.kv.size()); },
    [=](kv_expire_atom, uint64_t id) {
      auto& st = self->state;
      auto i = st.waiters.find(id);
      if (i == st.waiters.end())
        return;
      std::vector<std::string> missing;
      for (auto& k : i->second.keys)
        if (st.kv.count(k) == 0)
          missing.push_back(k);
      auto err = make_error(errc::timeout, "rendezvous store: timed out after "
                                               + std::to_string(i->second.timeout_ms)
                                               + " ms waiting for " + key_list(missing));
      if (i->second.value)
        i->second.value->deliver(err);
      else
        i->second.all_set->deliver(err);
      st.waiters.erase(i);
    },
  };
}

/// `key_value_store` over requests to a store actor.
class actor_store_client final : public backends::key_value_store {
public:
  actor_store_client(rendezvous_store_actor store, std::chrono::milliseconds timeout)
    : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const bytes& value) override {
    ask<void>("set " + strings::in_quotes(key), timeout_, kv_set_atom::value, key, value);
  }
  bytes get(const std::string& key, std::chrono::milliseconds timeout) override {
    return ask<bytes>("get " + strings::in_quotes(key), timeout + timeout_, kv_get_atom::value,
                      key, static_cast<int64_t>(timeout.count()));
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return ask<int64_t>("add to " + strings::in_quotes(key), timeout_, kv_add_atom::value, key,
                        delta);
  }
  bytes compare_set(const std::string& key, const bytes& expected,
                    const bytes& desired) override {
    return ask<bytes>("compare-set " + strings::in_quotes(key), timeout_, kv_swap_atom::value,
                      key, expected, desired);
  }
  bool check(const std::vector<std::string>& keys) override {
    return ask<bool>("check " + key_list(keys), timeout_, kv_check_atom::value, keys);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    ask<bool>("wait for " + key_list(keys), timeout + timeout_, kv_wait_atom::value, keys,
              static_cast<int64_t>(timeout.count()));
  }
  bool erase(const std::string& key) override {
    return ask<bool>("erase " + strings::in_quotes(key), timeout_, kv_erase_atom::value, key);
  }
  int64_t count() override { return ask<int64_t>("count keys", timeout_, kv_count_atom::value); }
  std::string description() const override {
    return "rendezvous store actor " + caf::to_string(store_.address());
  }

private:
  template <class T, class... Ts>
  T ask(const std::string& what, std::chrono::milliseconds bound, Ts&&... xs) {
    caf::scoped_actor self{store_.home_system()};
    std::optional<caf::error> failure;
    if constexpr (std::is_void_v<T>) {
      self->request(store_, bound, std::forward<Ts>(xs)...)
        .receive([] {}, [&](caf::error& e) { failure = std::move(e); });
      if (failure)
        raise(what, *failure);
    } else {
      T out{};
      self->request(store_, bound, std::forward<Ts>(xs)...)
        .receive([&](T& x) { out = std::move(x); }, [&](caf::error& e) { failure = std::move(e); });
      if (failure)
        raise(what, *failure);
      return out;
    }
  }

  [[noreturn]] void raise(const std::string& what, const caf::error& e) const {
    using backends::error_code;
    auto text = description() + ": " + what + ": " + store_.home_system().render(e);
    if (is(e, errc::timeout) || e == caf::sec::request_timeout)
      backends::fail(error_code::timeout, text);
    if (is(e, errc::invalid_argument))
      backends::fail(error_code::invalid_argument, text);
    backends::fail(error_code::backend_error, text);
  }

  rendezvous_store_actor store_;
  std::chrono::milliseconds timeout_;
};

} // namespace

rendezvous_store_actor spawn_rendezvous_store(caf::actor_system& sys, const caf::actor& owner) {
  return sys.spawn(store_actor, owner);
}

backends::store_handle connect_rendezvous_store(const rendezvous_store_actor& store,
                                                std::chrono::milliseconds timeout) {
  if (!store)
    backends::fail(backends::error_code::invalid_argument,
                   "rendezvous store: no store actor given");
  if (timeout.count() <= 0)
    backends::fail(backends::error_code::invalid_argument,
                   "rendezvous store: timeout must be > 0 ms, got "
                       + std::to_string(timeout.count()));
  return backends::make_external_store(std::make_shared<actor_store_client>(store, timeout));
}

} // namespace rlforge::actors

#include "backends/weights/fake_transport.hpp"
#include "backends/exception_text.hpp"

#include <mutex>
#include <optional>
#include <utility>

namespace rlforge::backends {

struct fake_channel::impl {
  explicit impl(transport_options opts) : channel(opts) {}

  in_process_channel channel;
  mutable std::mutex mutex;
  std::optional<std::pair<error_code, std::string>> send_failure;
  std::optional<std::pair<error_code, std::string>> receive_failure;
  std::vector<record> history;

  template <class T> static std::optional<T> pop(std::optional<T>& slot) {
    auto out = std::move(slot);
    slot.reset();
    return out;
  }
};

fake_channel::fake_channel(transport_options opts) : impl_(std::make_unique<impl>(opts)) {}

fake_channel::~fake_channel() = default;

void fake_channel::fail_next_send(error_code code, std::string message) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->send_failure.emplace(code, std::move(message));
}

void fake_channel::fail_next_receive(error_code code, std::string message) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->receive_failure.emplace(code, std::move(message));
}

std::vector<fake_channel::record> fake_channel::history() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->history;
}

in_process_channel& fake_channel::channel() {
  return impl_->channel;
}

fake_sender::fake_sender(std::shared_ptr<fake_channel> channel) : channel_(std::move(channel)) {
  if (!channel_)
    fail(error_code::invalid_argument, "fake sender: channel is null");
}

void fake_sender::send(const named_tensors& weights, std::uint64_t version) {
  auto& p = *channel_->impl_;
  in_process_channel::transfer t;
  t.sources = detail::sender_sources(weights, version, c10::Device(c10::kCPU), "fake sender");
  t.manifest = make_manifest(t.sources);
  t.version = version;
  fake_channel::record rec;
  rec.version = version;
  rec.manifest = t.manifest;
  std::optional<std::pair<error_code, std::string>> injected;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    injected = fake_channel::impl::pop(p.send_failure);
  }
  if (injected) {
    rec.message = "fake sender: injected failure: " + injected->second;
    std::lock_guard<std::mutex> lock(p.mutex);
    p.history.push_back(rec);
    fail(injected->first, rec.message);
  }
  auto o = p.channel.post_and_wait(std::move(t));
  rec.committed = o.committed;
  rec.message = o.message;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    p.history.push_back(std::move(rec));
  }
  if (!o.committed)
    detail::throw_outcome(o, "fake sender");
}

fake_receiver::fake_receiver(std::shared_ptr<fake_channel> channel)
    : channel_(std::move(channel)) {
  if (!channel_)
    fail(error_code::invalid_argument, "fake receiver: channel is null");
}

std::uint64_t fake_receiver::receive(const named_tensors& targets) {
  auto& p = *channel_->impl_;
  const auto& t = p.channel.take();
  std::optional<std::pair<error_code, std::string>> injected;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    injected = fake_channel::impl::pop(p.receive_failure);
  }
  in_process_channel::outcome o;
  o.version = version_;
  try {
    if (injected)
      fail(injected->first, "fake receiver: injected failure: " + injected->second);
    check_transfer(t.manifest, t.version, targets, version_);
    detail::copy_transfer(t, targets, p.channel.options().bucket_bytes);
  } catch (const error& e) {
    o.code = e.code();
    o.message = e.what();
    p.channel.complete(std::move(o));
    throw;
  } catch (const std::exception& e) {
    o.code = error_code::internal;
    o.message = exception_first_line(e);
    p.channel.complete(std::move(o));
    throw;
  }
  version_ = t.version;
  o.committed = true;
  o.version = version_;
  p.channel.complete(std::move(o));
  return version_;
}

} // namespace rlforge::backends

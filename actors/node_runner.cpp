#include "actors/node_runner.hpp"

#include <thread>

#include <caf/all.hpp>

#include "actors/local_exit.hpp"
#include "actors/weight_sync.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors {

namespace {

bool stopping(const node_runner_options& o) {
  return o.stop != nullptr && o.stop->load();
}

std::string render(caf::actor_system& sys, const caf::error& err) {
  auto msg = error_message(err);
  return msg.empty() ? sys.render(err) : msg;
}

/// Sleeps up to `d`, waking early when the node is told to stop.
void pause(const node_runner_options& o, std::chrono::milliseconds d) {
  auto until = std::chrono::steady_clock::now() + d;
  while (!stopping(o) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

} // namespace

int run_node(caf::actor_system& sys, node_runner_options opts) {
  auto say = [&](const std::string& line) {
    if (opts.report)
      opts.report(line);
  };
  const auto& id = opts.agent.resources.node_id;
  const auto head_name = "the head at " + runtime::to_string(opts.head);
  set_advertised_address(opts.agent.address);
  auto agent = spawn_node_agent(sys, opts.agent);
  auto stop_agent = [&] { stop_from_this_process(sys, agent); };
  auto port = runtime::publish_actor(sys, agent, opts.port, opts.agent.address);
  if (!port) {
    say("node '" + id + "': cannot listen on " + opts.agent.address + ":"
        + std::to_string(opts.port) + ": " + sys.render(port.error()));
    stop_agent();
    return 1;
  }
  auto first_deadline = std::chrono::steady_clock::now() + opts.first_join_timeout;
  bool joined_once = false;
  std::string last_problem;
  caf::scoped_actor self{sys};
  head_actor head;
  while (!stopping(opts)) {
    auto h = runtime::connect_actor<head_actor>(sys, opts.head, head_name);
    caf::error failure;
    if (h) {
      self->request(agent, opts.agent.join_timeout + std::chrono::seconds(2), use_head_atom::value,
                    caf::actor_cast<caf::actor>(*h), *port)
        .receive(
          [&](join_reply& r) {
            head = *h;
            say("node '" + id + "': " + (joined_once ? "rejoined" : "joined") + " cluster "
                + r.cluster_id + " at " + runtime::to_string(opts.head) + " (agent on "
                + opts.agent.address + ":" + std::to_string(*port) + ")");
          },
          [&](caf::error& err) { failure = std::move(err); });
    } else {
      failure = std::move(h.error());
    }
    if (failure) {
      auto problem = render(sys, failure);
      bool refusal = is(failure, errc::unsupported) || is(failure, errc::already_exists)
                     || is(failure, errc::invalid_argument);
      if (!joined_once && (refusal || std::chrono::steady_clock::now() > first_deadline)) {
        say("node '" + id + "': " + problem);
        stop_agent();
        return 1;
      }
      if (problem != last_problem)
        say("node '" + id + "': waiting for " + head_name + ": " + problem);
      last_problem = problem;
      pause(opts, opts.retry);
      continue;
    }
    joined_once = true;
    last_problem.clear();
    // Watch the head until it is lost or the node is told to stop.
    self->monitor(head);
    bool lost = false;
    while (!lost && !stopping(opts))
      self->receive(
        [&](caf::down_msg& dm) {
          if (dm.source == head.address()) {
            lost = true;
            say("node '" + id + "': lost " + head_name + " (" + sys.render(dm.reason) + "); "
                + (opts.agent.head_grace.count() == 0
                     ? std::string{"its ranks were stopped"}
                     : "its ranks wait up to " + std::to_string(opts.agent.head_grace.count())
                         + " ms for the head")
                + "; joining again");
          }
        },
        caf::after(std::chrono::milliseconds(50)) >> [] {});
    if (!lost)
      break;
    self->demonitor(head.address());
    head = head_actor{};
    pause(opts, opts.retry);
  }
  if (head) {
    self->send(head, leave_atom::value, id);
    // Let the leave go out before the connection closes.
    self->request(head, std::chrono::seconds(2), cluster_status_atom::value)
      .receive([](std::string&) {}, [](caf::error&) {});
    say("node '" + id + "': left the cluster");
  }
  stop_agent();
  return 0;
}

} // namespace rlforge::actors

#include "bench/local_serve.hpp"

#include <stdexcept>

#include <caf/deep_to_string.hpp>

#include "actors/engine.hpp"
#include "actors/worker.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"

namespace rlforge::bench {

runtime::system_config& local_serve::configured(runtime::system_config& cfg) {
  actors::register_worker_kinds();
  actors::register_engine_kind();
  if (auto err = cfg.parse_args({}))
    throw std::runtime_error("actor system configuration: " + caf::to_string(err));
  return cfg;
}

actors::dispatcher_backend_options local_serve::backend_options(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  auto base = (dir / "tiny-base").string();
  backends::causal_lm::random(backends::preset("tiny"), 7)->save_hf(base);
  actors::dispatcher_backend_options bo;
  bo.base_model_dir = base;
  return bo;
}

service::server_options local_serve::server_options(const std::filesystem::path& dir,
                                                    const std::string& api_key) {
  service::server_options so;
  so.api_key = api_key;
  so.checkpoint_dir = (dir / "checkpoints").string();
  return so;
}

local_serve::local_serve(const std::filesystem::path& dir, const std::string& api_key)
    : sys_(configured(cfg_)),
      backend(sys_, backend_options(dir)),
      store_(service::future_store::open((dir / "serve.db").string())),
      server_(std::make_unique<service::http_server>(server_options(dir, api_key), backend,
                                                     *store_)),
      port_(server_->start()),
      client("127.0.0.1", port_, api_key) {}

local_serve::~local_serve() {
  server_->stop();
}

} // namespace rlforge::bench

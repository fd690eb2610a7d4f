// The OpenAI-compatible endpoints: POST /v1/completions, POST /v1/chat/completions (whole answers
// and server-sent events), GET /v1/models. They sample through the same scheduler lanes as the
// Tinker API's asample, under the same num_samples cap and queue bound.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>

#include "chat/error.hpp"
#include "prompt/chat_prompt.hpp"
#include "service/http/server_state.hpp"
#include "service/openai/request.hpp"
#include "service/openai/response.hpp"
#include "text/error.hpp"
#include "tinker/datum_check.hpp"

namespace rlforge::service::http {

namespace {

using ojson = nlohmann::ordered_json;
namespace oa = openai;

/// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
void reply_openai_error(httplib::Response& res, int status, const std::string& message,
                        const std::string& param = "") {
  const char* type = status == 401   ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  ojson e{{"message", message}, {"type", type}};
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  e["code"] = nullptr;
  res.status = status;
  res.set_content(ojson{{"error", e}}.dump(), json_type);
}

bool stopping(server_state& s) {
  std::lock_guard<std::mutex> guard(s.poll_mutex);
  return s.stopping;
}

/// The base model's tokenizer and chat template, loaded on first use (and again after a failed
/// load, so a server whose base model lacks them says why on each call).
std::shared_ptr<const prompt::chat_prompt> require_chat(server_state& s) {
  std::lock_guard<std::mutex> guard(s.chat_mutex);
  if (s.chat)
    return s.chat;
  auto dir = s.backend.tokenizer_id();
  if (!dir)
    throw http_error(http_status::bad_request, "the base model '" + s.backend.base_model_name() +
                              "' has no tokenizer (tokenizer.json or tokenizer.model in its "
                              "directory); the OpenAI endpoints need one. Use the Tinker API with "
                              "token ids instead");
  try {
    s.chat = std::make_shared<const prompt::chat_prompt>(prompt::chat_prompt::load(*dir));
  } catch (const std::exception& e) {
    throw http_error(http_status::internal_error, "the base model's tokenizer did not load: " + std::string(e.what()));
  }
  return s.chat;
}

/// The weights `model` names: the base model, or a sampler checkpoint by its tinker:// path.
tinker::sampler_ref sampler_named(server_state& s, const std::string& model) {
  tinker::sampler_ref ref;
  if (model == s.backend.base_model_name()) {
    ref.name = "base model " + model;
    return ref;
  }
  if (model.rfind("tinker://", 0) == 0) {
    s.purge_expired(); // an expired checkpoint is gone for sampling too
    auto c = s.store.get_checkpoint(model);
    if (!c)
      throw oa::request_error("model", "no checkpoint '" + model + "' (GET /v1/models lists them)",
                              404);
    try {
      require_sampler_kind(*c);
    } catch (const http_error& e) {
      throw oa::request_error("model", e.what(), e.status);
    }
    ref.type = tinker::sampler_ref::kind::checkpoint;
    ref.dir = c->dir;
    ref.name = model;
    return ref;
  }
  throw oa::request_error("model",
                          "model '" + model + "' is not served here; this server serves '" +
                              s.backend.base_model_name() +
                              "' and its sampler checkpoints (GET /v1/models lists them)",
                          404);
}

/// The Tinker sample request of `r`: the prompt encoded (chat: through the chat template), the
/// weights it names, its sampling settings and stop tokens (the end of an assistant turn for chat,
/// the tokenizer's end of text for both).
tinker::sample_request sample_request_of(server_state& s, const oa::generation_request& r,
                                         const prompt::chat_prompt& chat) {
  tinker::sample_request t;
  if (r.kind == oa::endpoint::chat_completions) {
    if (!chat.has_template())
      throw oa::request_error("messages", "the base model has no chat template; use "
                                          "/v1/completions with a prompt");
    try {
      t.prompt = chat.encode(r.messages, /*add_generation_prompt=*/true);
    } catch (const chat::template_error& e) {
      throw oa::request_error("messages", std::string("the chat template refused the messages: ") +
                                              e.what());
    }
    if (auto id = chat.end_of_turn_id())
      t.params.stop_tokens.push_back(*id);
  } else if (r.prompt_text) {
    t.prompt = chat.tokenizer().encode(*r.prompt_text, /*add_special_tokens=*/true);
    if (t.prompt.empty())
      throw oa::request_error("prompt", "the prompt encodes to no tokens");
  } else {
    t.prompt = r.prompt_ids;
  }
  if (auto eos = chat.tokenizer().eos_token();
      eos && std::find(t.params.stop_tokens.begin(), t.params.stop_tokens.end(), eos->id) ==
                 t.params.stop_tokens.end())
    t.params.stop_tokens.push_back(eos->id);
  const auto context = s.backend.max_context_length();
  const auto prompt_len = static_cast<int64_t>(t.prompt.size());
  // A top-logprobs answer scores prompt + answer once more: one position to spare.
  const int64_t spare = r.top_logprobs > 0 ? 1 : 0;
  if (r.max_tokens) {
    t.params.max_tokens = *r.max_tokens;
    if (context > 0 && prompt_len + *r.max_tokens + spare > context)
      throw oa::request_error("max_tokens",
                              "a prompt of " + std::to_string(prompt_len) + " tokens plus " +
                                  std::to_string(*r.max_tokens) + " new tokens" +
                                  (spare ? " (and one position for top_logprobs)" : "") +
                                  " exceeds the model's context of " + std::to_string(context) +
                                  " tokens");
  } else {
    t.params.max_tokens = context - prompt_len - spare;
    if (t.params.max_tokens < 1)
      throw oa::request_error("messages", "the prompt of " + std::to_string(prompt_len) +
                                              " tokens leaves no room in the model's context of " +
                                              std::to_string(context) + " tokens");
  }
  if (r.n > s.opts.max_num_samples)
    throw oa::request_error("n", "n " + std::to_string(r.n) + " exceeds this server's limit of " +
                                     std::to_string(s.opts.max_num_samples) +
                                     " per request (rlforge serve --max-num-samples)");
  t.num_samples = r.n;
  t.params.temperature = r.temperature;
  t.params.top_p = r.top_p;
  t.params.has_seed = r.seed.has_value();
  t.params.seed = r.seed.value_or(0);
  t.params.stop_strings = r.stop;
  t.sampler = sampler_named(s, r.model);
  tinker::model_limits limits{s.backend.vocab_size(), context};
  try {
    tinker::check_sample(t, limits, "request");
  } catch (const tinker::request_error& e) {
    throw oa::request_error(r.kind == oa::endpoint::chat_completions ? "messages" : "prompt",
                            e.what());
  }
  return t;
}

/// Runs `t` through the scheduler and waits for its answer (429 when the queue is full, 503 when
/// the server stops meanwhile).
tinker::sample_response sample_whole(server_state& s, tinker::sample_request t) {
  auto result = std::make_shared<std::promise<tinker::sample_response>>();
  auto answer = result->get_future();
  request_scheduler::completion<tinker::sample_response> c{
      [result](tinker::sample_response r) { result->set_value(std::move(r)); },
      [result](const failure& f) {
        result->set_exception(std::make_exception_ptr(tinker::request_error(f.category, f.message)));
      }};
  {
    std::lock_guard<std::mutex> guard(s.submit_mutex);
    if (!s.sched->try_submit_sample(std::move(t), std::move(c)))
      throw http_error(http_status::too_many_requests, "sampling queue full; retry later");
  }
  while (answer.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready)
    if (stopping(s))
      throw http_error(http_status::unavailable, "server shutting down");
  return answer.get();
}

/// Per generated position, the `k` most likely tokens under the raw model distribution: the
/// prompt and the answer scored as one prompt (`topk_prompt_logprobs`), one request per choice.
std::vector<std::vector<std::pair<int64_t, double>>>
top_alternatives(server_state& s, const tinker::sample_request& t,
                 const tinker::sampled_sequence& seq, int64_t k) {
  tinker::sample_request score;
  score.prompt = t.prompt;
  score.prompt.insert(score.prompt.end(), seq.tokens.begin(), seq.tokens.end());
  score.params.max_tokens = 1;
  score.params.temperature = 0;
  score.topk_prompt_logprobs = k;
  score.sampler = t.sampler;
  auto scored = sample_whole(s, std::move(score));
  std::vector<std::vector<std::pair<int64_t, double>>> out;
  const auto p = t.prompt.size();
  for (size_t i = 0; i < seq.tokens.size(); ++i) {
    std::vector<std::pair<int64_t, double>> row;
    const size_t at = (p + i) * static_cast<size_t>(k);
    for (size_t j = 0; j < static_cast<size_t>(k); ++j)
      row.emplace_back(scored.topk_prompt_ids.at(at + j), scored.topk_prompt_logprobs.at(at + j));
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<oa::token_info> token_infos(const tinker::sampled_sequence& seq) {
  std::vector<oa::token_info> out;
  for (size_t i = 0; i < seq.tokens.size(); ++i)
    out.push_back({seq.tokens[i], seq.logprobs.at(i), {}});
  return out;
}

std::string new_id(const oa::generation_request& r) {
  return std::string(r.kind == oa::endpoint::chat_completions ? "chatcmpl-" : "cmpl-") +
         random_token();
}

int64_t now_seconds() {
  return future_store::now_ms() / 1000;
}

void answer_whole(server_state& s, const oa::generation_request& r, tinker::sample_request t,
                  const prompt::chat_prompt& chat, httplib::Response& res) {
  const auto prompt_tokens = static_cast<int64_t>(t.prompt.size());
  auto out = sample_whole(s, t);
  oa::logprob_writer writer(chat, r.tokens_as_ids);
  auto body = oa::envelope(r.kind, false, new_id(r), now_seconds(), r.model);
  body["choices"] = ojson::array();
  int64_t completion_tokens = 0;
  for (size_t i = 0; i < out.sequences.size(); ++i) {
    auto& seq = out.sequences[i];
    completion_tokens += static_cast<int64_t>(seq.tokens.size());
    oa::choice_text text(chat, r.stop);
    auto content = text.push(seq.tokens, true);
    auto infos = token_infos(seq);
    if (r.top_logprobs > 0) {
      auto top = top_alternatives(s, t, seq, r.top_logprobs);
      for (size_t j = 0; j < infos.size(); ++j)
        infos[j].top = std::move(top[j]);
    }
    ojson choice;
    choice["index"] = i;
    if (r.kind == oa::endpoint::chat_completions) {
      choice["message"] = ojson{{"role", "assistant"}, {"content", content}};
      choice["logprobs"] = r.logprobs ? writer.chat(infos) : ojson(nullptr);
    } else {
      choice["text"] = content;
      choice["logprobs"] = r.logprobs ? writer.completion(infos, r.top_logprobs > 0, 0)
                                      : ojson(nullptr);
    }
    choice["finish_reason"] = oa::finish_reason(seq.stop_reason, text.stopped_by_string());
    body["choices"].push_back(std::move(choice));
  }
  body["usage"] = oa::usage_json(prompt_tokens, completion_tokens);
  res.set_content(body.dump(), json_type);
}

/// A streamed answer: the events the scheduler's worker produces and the HTTP thread writes.
struct event_stream {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::string> events; ///< SSE frames, ready to write
  bool done = false;              ///< nothing follows the queued events
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  /// Frames queued and not yet written to the client: the scheduler holds the next chunk while
  /// any are (the stream runs one chunk ahead of its reader at most).
  std::atomic<size_t> unwritten{0};

  void push(std::string frame, bool last = false) {
    {
      std::lock_guard<std::mutex> guard(mutex);
      events.push_back(std::move(frame));
      done = done || last;
      ++unwritten;
    }
    cv.notify_all();
  }
};

std::string sse(const ojson& data) {
  return "data: " + data.dump() + "\n\n";
}

/// The worker-side state of a streamed answer: each choice's text and how many have finished.
struct stream_builder {
  stream_builder(const oa::generation_request& r, std::shared_ptr<const prompt::chat_prompt> chat,
                 int64_t prompt_tokens)
      : request(r), chat(std::move(chat)), writer(*this->chat, r.tokens_as_ids),
        prompt_tokens(prompt_tokens), id(new_id(r)), created(now_seconds()) {
    for (int64_t i = 0; i < r.n; ++i)
      texts.emplace_back(*this->chat, r.stop);
    offsets.assign(static_cast<size_t>(r.n), 0);
  }

  ojson chunk() const { return oa::envelope(request.kind, true, id, created, request.model); }

  /// The chunk of choice `index` for `delta` (nullopt when it carries nothing).
  std::optional<std::string> on_tokens(int64_t index, const tinker::sampled_sequence& delta,
                                       bool finished) {
    auto& text = texts.at(static_cast<size_t>(index));
    completion_tokens += static_cast<int64_t>(delta.tokens.size());
    auto piece = text.push(delta.tokens, finished);
    if (piece.empty() && !finished && !(request.logprobs && !delta.tokens.empty()))
      return std::nullopt;
    ojson choice;
    choice["index"] = index;
    auto infos = token_infos(delta);
    if (request.kind == oa::endpoint::chat_completions) {
      choice["delta"] = piece.empty() ? ojson::object() : ojson{{"content", piece}};
      choice["logprobs"] = request.logprobs ? writer.chat(infos) : ojson(nullptr);
    } else {
      auto& offset = offsets.at(static_cast<size_t>(index));
      choice["text"] = piece;
      choice["logprobs"] = request.logprobs ? writer.completion(infos, false, offset)
                                            : ojson(nullptr);
      offset += piece.size();
    }
    choice["finish_reason"] = finished ? ojson(oa::finish_reason(delta.stop_reason,
                                                                  text.stopped_by_string()))
                                       : ojson(nullptr);
    auto c = chunk();
    c["choices"] = ojson::array({choice});
    return sse(c);
  }

  const oa::generation_request request;
  /// The tokenizer `writer` and `texts` read, kept alive as long as the stream.
  const std::shared_ptr<const prompt::chat_prompt> chat;
  oa::logprob_writer writer;
  const int64_t prompt_tokens;
  const std::string id;
  const int64_t created;
  std::vector<oa::choice_text> texts;
  std::vector<size_t> offsets;
  int64_t completion_tokens = 0;
  int64_t finished = 0;
};

void answer_stream(server_state& s, const oa::generation_request& r, tinker::sample_request t,
                   std::shared_ptr<const prompt::chat_prompt> chat, httplib::Response& res) {
  auto events = std::make_shared<event_stream>();
  auto builder = std::make_shared<stream_builder>(r, std::move(chat),
                                                  static_cast<int64_t>(t.prompt.size()));
  if (r.kind == oa::endpoint::chat_completions)
    for (int64_t i = 0; i < r.n; ++i) {
      auto c = builder->chunk();
      c["choices"] = ojson::array({ojson{{"index", i},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
      events->push(sse(c));
    }
  request_scheduler::stream_sink sink;
  sink.cancelled = events->cancelled;
  sink.ready = [events] { return events->unwritten.load() == 0; };
  sink.tokens = [events, builder](int64_t index, tinker::sampled_sequence delta, bool finished) {
    if (auto frame = builder->on_tokens(index, delta, finished))
      events->push(std::move(*frame));
    if (finished && ++builder->finished == builder->request.n) {
      if (builder->request.include_usage) {
        auto c = builder->chunk();
        c["choices"] = ojson::array();
        c["usage"] = oa::usage_json(builder->prompt_tokens, builder->completion_tokens);
        events->push(sse(c));
      }
      events->push("data: [DONE]\n\n", true);
    }
  };
  sink.failed = [events](const failure& f) {
    ojson e{{"message", f.message},
            {"type", f.category == tinker::error_category::server ? "server_error"
                                                                  : "invalid_request_error"}};
    events->push(sse(ojson{{"error", e}}), true);
  };
  {
    std::lock_guard<std::mutex> guard(s.submit_mutex);
    if (!s.sched->try_submit_stream(std::move(t), s.opts.stream_chunk_tokens, std::move(sink)))
      throw http_error(http_status::too_many_requests, "sampling queue full; retry later");
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [&s, events](size_t, httplib::DataSink& out) {
        std::deque<std::string> ready;
        bool done = false;
        {
          std::unique_lock<std::mutex> lock(events->mutex);
          events->cv.wait_for(lock, std::chrono::seconds(1),
                              [&] { return events->done || !events->events.empty(); });
          ready.swap(events->events);
          done = events->done;
        }
        const size_t taken = ready.size();
        // A comment line when nothing came for a second: a client that left shows up as a
        // failed write, and the generation stops.
        if (ready.empty() && !done)
          ready.push_back(": keep-alive\n\n");
        for (auto& frame : ready)
          if (!out.write(frame.data(), frame.size())) {
            events->cancelled->store(true);
            return false;
          }
        if (taken > 0 && events->unwritten.fetch_sub(taken) == taken)
          s.sched->wake(); // all written: the next chunk may go
        if (done)
          out.done();
        else if (stopping(s)) {
          events->cancelled->store(true);
          return false;
        }
        return true;
      },
      [events](bool) {
        // The answer ended: written whole, or the client went away. Either way nothing more
        // is generated for it.
        events->cancelled->store(true);
      });
}

void generate(server_state& s, oa::endpoint kind, const httplib::Request& req,
              httplib::Response& res) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded())
    throw oa::request_error("", "the body is not valid JSON");
  auto r = oa::read_request(kind, body);
  auto chat = require_chat(s);
  auto t = sample_request_of(s, r, *chat);
  s.log->info("event=openai_request kind={} model=\"{}\" n={} stream={} prompt_tokens={}{}",
              kind == oa::endpoint::chat_completions ? "chat" : "completion", r.model, r.n,
              r.stream, t.prompt.size(), r.user.empty() ? "" : " user=\"" + r.user + "\"");
  if (r.stream)
    answer_stream(s, r, std::move(t), chat, res);
  else
    answer_whole(s, r, std::move(t), *chat, res);
}

void list_models(server_state& s, httplib::Response& res) {
  ojson data = ojson::array();
  const auto base = s.backend.base_model_name();
  data.push_back(ojson{{"id", base},
                       {"object", "model"},
                       {"created", s.started_seconds},
                       {"owned_by", "rlforge"},
                       {"max_model_len", s.backend.max_context_length()}});
  s.purge_expired();
  for (const auto& c : s.store.list_checkpoints())
    if (c.kind == checkpoint_kind::sampler_weights)
      data.push_back(ojson{{"id", c.tinker_path},
                           {"object", "model"},
                           {"created", c.created_ms / 1000},
                           {"owned_by", "rlforge"},
                           {"parent", base},
                           {"max_model_len", s.backend.max_context_length()}});
  res.set_content(ojson{{"object", "list"}, {"data", std::move(data)}}.dump(), json_type);
}

/// A /v1 handler whose exceptions become OpenAI error bodies (a refused parameter names it; the
/// rest as `current_http_failure` decides), counted in the metrics.
httplib::Server::Handler openai_guarded(server_state& s, const std::string& path, handler fn) {
  return [&s, path, fn = std::move(fn)](const httplib::Request& req, httplib::Response& res) {
    try {
      fn(req, res);
    } catch (const oa::request_error& e) {
      reply_openai_error(res, e.status(), e.what(), e.param());
    } catch (const text::tokenizer_error& e) {
      reply_openai_error(res, 400, std::string("the tokenizer refused the prompt: ") + e.what(),
                         "prompt");
    } catch (...) {
      auto f = current_http_failure(s, req);
      if (f.status == 429 || f.status == 503)
        res.set_header("Retry-After", "1");
      reply_openai_error(res, f.status, f.message);
    }
    finish_request(s, req, res, path);
  };
}

} // namespace

void reply_openai_unauthorized(httplib::Response& res, const std::string& message) {
  reply_openai_error(res, 401, message);
}

void add_openai_endpoints(server_state& s) {
  s.svr.Post("/v1/completions", openai_guarded(s, "/v1/completions", [&s](auto& req, auto& res) {
               generate(s, oa::endpoint::completions, req, res);
             }));
  s.svr.Post("/v1/chat/completions",
             openai_guarded(s, "/v1/chat/completions", [&s](auto& req, auto& res) {
               generate(s, oa::endpoint::chat_completions, req, res);
             }));
  s.svr.Get("/v1/models",
            openai_guarded(s, "/v1/models", [&s](auto&, auto& res) { list_models(s, res); }));
}

} // namespace rlforge::service::http

#include "tinker/error.hpp"

namespace rlforge::tinker {

const char* to_string(error_category x) noexcept {
  switch (x) {
  case error_category::user:
    return "user";
  case error_category::not_found:
    return "not_found";
  case error_category::server:
    return "server";
  }
  return "server";
}

int http_status(error_category x) noexcept {
  switch (x) {
  case error_category::user:
    return 400;
  case error_category::not_found:
    return 404;
  case error_category::server:
    return 500;
  }
  return 500;
}

const char* future_category(error_category x) noexcept {
  return x == error_category::server ? "server" : "user";
}

request_error::request_error(error_category category, const std::string& message)
    : std::runtime_error(message), category_(category) {}

void fail_user(const std::string& message) {
  throw request_error(error_category::user, message);
}

void fail_not_found(const std::string& message) {
  throw request_error(error_category::not_found, message);
}

void fail_server(const std::string& message) {
  throw request_error(error_category::server, message);
}

} // namespace rlforge::tinker

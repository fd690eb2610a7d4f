#include "backends/exception_text.hpp"

#include <c10/util/Exception.h>

namespace rlforge::backends {

std::string exception_first_line(const std::exception& e) {
  std::string m;
  if (auto c10_error = dynamic_cast<const c10::Error*>(&e))
    m = c10_error->what_without_backtrace();
  else
    m = e.what();
  auto eol = m.find('\n');
  if (eol != std::string::npos)
    m.resize(eol);
  return m;
}

} // namespace rlforge::backends

#pragma once

#include "chat/value.hpp"

/// The global functions a chat template may call, as transformers defines them: `range`,
/// `namespace`, `dict`, `raise_exception(message)` (throws error_kind::raised with the message)
/// and `strftime_now(format)` (local time, C `strftime` in the "C" locale, as Python's
/// datetime.now().strftime; `%f` is refused). Jinja's other default globals (`cycler`,
/// `joiner`, `lipsum`) exist but refuse to run (error_kind::unsupported). Reentrant.
namespace rlforge::chat::detail {

/// A fresh dict of the globals above.
value_dict make_globals();

} // namespace rlforge::chat::detail

#pragma once

#include <optional>
#include <string>

#include "chat/value.hpp"

/// Attribute and item access with Jinja's rules, and the methods of str and dict that chat
/// templates call. `obj.name` tries the Python attribute (a method) first, then the item;
/// `obj[key]` tries the item first, then (for a str key) the attribute. Missing keys, attributes
/// and indexes give Undefined (with a hint); using anything of Undefined throws its hint.
///
/// Methods: str.startswith/endswith (a prefix or a tuple of them), split/rsplit, strip/lstrip/
/// rstrip (with optional chars), upper/lower (ASCII), replace, join; dict.get/items/keys/values.
/// Any other Python method of str, list or dict is refused (error_kind::unsupported) naming it,
/// since Python would find it and this engine cannot run it. Reentrant.
namespace rlforge::chat::detail {

/// `obj.name`.
value get_attribute(const value& obj, const std::string& name, source_position where);

/// `obj[key]`.
value get_item(const value& obj, const value& key, source_position where);

/// `obj[start:stop:step]` on a list or str (Python slice semantics, by code point).
value get_slice(const value& obj, const std::optional<value>& start,
                const std::optional<value>& stop, const std::optional<value>& step,
                source_position where);

} // namespace rlforge::chat::detail

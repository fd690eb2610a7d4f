#include "actors/tinker_backend.hpp"

namespace rlforge::actors {

tinker_backend::~tinker_backend() = default;

} // namespace rlforge::actors

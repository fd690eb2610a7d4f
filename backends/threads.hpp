#pragma once

namespace rlforge::backends {

/// Sets torch's intra-op thread count for the calling OS thread (and the global default new
/// threads pick up). torch keeps this per OS thread: call it at the start of each detached
/// actor so ranks on one node never oversubscribe its cores. `n` must be ≥ 1.
void set_intra_op_threads(int n);

/// torch's intra-op thread count as seen by the calling OS thread.
int intra_op_threads();

} // namespace rlforge::backends

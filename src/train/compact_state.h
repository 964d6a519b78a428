// The compact training state (TrainOptions::compact_state, `train --compact-state`): a run's
// state small enough to travel in version control between sessions (issue 36: at most 4 MB a
// state file), written at the invocation's stop and read by --resume.
//
// - Adam/AdamW: the first moments are left out (they rebuild within about 1/(1-beta1) = 10
//   steps), the second moments kept as 8-bit codes of their base-2 logarithm, per block of 256
//   values between the block's largest and the smallest not 2^32 below it (an exact 0 stays 0;
//   a value further below comes back as that floor): within 4.5 % of the value, 2.2 % of the
//   sqrt(v) Adam divides by. Step counts exact. ("LSOPTQ8" bytes; SGD's state is
//   written whole.) The first compact form (bf16 second moments in torch's archive) still loads.
// - EMA runs: the raw weights the optimizer works on are written as their difference from the
//   average (the checkpoint's tensors), int8 per block of 256 with the block's scale, instead of
//   a second float32 copy of the network ("raw_weights_q8"; the full form is "raw_weights").
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace lightseg {

// The optimizer's state in compact form. opt is unchanged.
std::string compact_optimizer_bytes(torch::optim::Optimizer& opt);
// Loads any form compact_optimizer_bytes or to_archive_bytes wrote into an optimizer over the
// same parameters (its state is replaced); tensors land on `device`. Throws std::runtime_error on
// bytes that do not fit its parameters.
void load_optimizer_bytes(torch::optim::Optimizer& opt, const std::string& bytes, torch::Device device);
// After loading either form: moments back in float32 on their parameters' device, a left-out
// first moment as zeros. Returns the number of first moments restarted at zero.
int64_t expand_optimizer_state(torch::optim::Optimizer& opt);

// The raw weights of an EMA run (its network's parameters and buffers) as their difference from
// the average `ema` (a module of the same structure).
std::string compact_weights_delta_bytes(const torch::nn::Module& raw, const torch::nn::Module& ema);
// raw's parameters and buffers += the differences (raw holds the average when called). Throws
// std::runtime_error on bytes of another network.
void add_weights_delta(torch::nn::Module& raw, const std::string& bytes);

}  // namespace lightseg

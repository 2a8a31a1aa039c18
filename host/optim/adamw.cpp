// The optimizer (see adamw.h).
#include "host/optim/adamw.h"

#include <ATen/ATen.h>

#include <string>

namespace anatomy::optim {
namespace {

// LibTorch keys its per-parameter state by the parameter's TensorImpl address
// (a string in 1.13).
std::string key_of(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

void check(const AdamWOptions& o) {
  if (!(o.lr_ >= 0)) throw OptionError("lr", "learning rate must be non-negative, got " + std::to_string(o.lr_));
  if (!(o.beta1_ >= 0 && o.beta1_ < 1)) throw OptionError("betas", "beta1 must be in [0, 1), got " + std::to_string(o.beta1_));
  if (!(o.beta2_ >= 0 && o.beta2_ < 1)) throw OptionError("betas", "beta2 must be in [0, 1), got " + std::to_string(o.beta2_));
  if (!(o.eps_ > 0)) throw OptionError("eps", "eps must be positive, got " + std::to_string(o.eps_));
  if (!(o.weight_decay_ >= 0)) throw OptionError("weight_decay", "weight_decay must be non-negative, got " + std::to_string(o.weight_decay_));
}

torch::optim::AdamWOptions torch_options(const AdamWOptions& o, double weight_decay) {
  return torch::optim::AdamWOptions(o.lr_).betas({o.beta1_, o.beta2_}).eps(o.eps_).weight_decay(weight_decay);
}

}  // namespace

AdamW::AdamW(std::vector<at::Tensor> decayed, std::vector<at::Tensor> plain, const AdamWOptions& options) {
  check(options);
  if (decayed.empty() && plain.empty()) throw OptionError("params", "no parameters to optimize");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty())
    groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(torch_options(options, options.weight_decay_)));
  if (!plain.empty()) groups.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(torch_options(options, 0)));
  adamw_ = std::make_unique<torch::optim::AdamW>(std::move(groups), torch_options(options, options.weight_decay_));
}

void AdamW::zero_grad() {
  for (auto& group : adamw_->param_groups())
    for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
}

void AdamW::set_lr(double lr) {
  if (!(lr >= 0)) throw OptionError("lr", "learning rate must be non-negative, got " + std::to_string(lr));
  for (auto& group : adamw_->param_groups()) group.options().set_lr(lr);
}

double AdamW::lr() const { return adamw_->param_groups().at(0).options().get_lr(); }

size_t AdamW::size() const {
  size_t n = 0;
  for (const auto& group : adamw_->param_groups()) n += group.params().size();
  return n;
}

std::vector<std::optional<ParamState>> AdamW::state() const {
  std::vector<std::optional<ParamState>> out;
  for (const auto& group : adamw_->param_groups()) {
    for (const auto& p : group.params()) {
      auto it = adamw_->state().find(key_of(p));
      if (it == adamw_->state().end()) {
        out.emplace_back();
      } else {
        const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
        out.push_back(ParamState{s.step(), s.exp_avg(), s.exp_avg_sq()});
      }
    }
  }
  return out;
}

void AdamW::load_state(const std::vector<std::optional<ParamState>>& states) {
  size_t i = 0;
  for (auto& group : adamw_->param_groups()) {
    for (auto& p : group.params()) {
      const auto* s = i < states.size() && states[i] ? &*states[i] : nullptr;
      ++i;
      if (!s) {
        adamw_->state().erase(key_of(p));
        continue;
      }
      if (!s->exp_avg.defined() || !s->exp_avg_sq.defined() || !s->exp_avg.sizes().equals(p.sizes()) ||
          !s->exp_avg_sq.sizes().equals(p.sizes()))
        throw OptionError("state", "state of parameter " + std::to_string(i) + " does not match its shape");
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(s->step);
      state->exp_avg(s->exp_avg.detach().to(p.options()).clone());
      state->exp_avg_sq(s->exp_avg_sq.detach().to(p.options()).clone());
      adamw_->state()[key_of(p)] = std::move(state);
    }
  }
}

}  // namespace anatomy::optim

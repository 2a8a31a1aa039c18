// The optimizer (see adamw.h).
#include "host/optim/adamw.h"

#include <ATen/ATen.h>

#include <string>

#include "host/torch_compat.h"

namespace anatomy::optim {
namespace {

// LibTorch keys its per-parameter state by the parameter's TensorImpl address.
auto key_of(const at::Tensor& p) { return compat::optimizer_state_key(p); }

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

void AdamW::step() {
  if (capturable_) capturable_step();
  else if (!fused_step()) adamw_->step();
}

// PyTorch's fused AdamW kernel (LibTorch 2.4 and later) for parameters on a
// device: per group, the step counts advanced in one call and the update in
// another. False where it does not apply (the CPU, whose numbers stay
// LibTorch's AdamW's, as torch.optim.AdamW's default; or an older LibTorch).
bool AdamW::fused_step() {
#if ANATOMY_TORCH_AT_LEAST(2, 4)
  const at::Tensor* first = nullptr;
  for (auto& group : adamw_->param_groups())
    for (auto& p : group.params())
      if (!first) first = &p;
  if (!first || first->is_cpu() || first->is_meta()) return false;
  at::NoGradGuard no_grad;
  auto& states = adamw_->state();
  for (auto& group : adamw_->param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (auto& p : group.params()) {
      const auto& grad = p.grad();
      if (!grad.defined()) continue;
      TORCH_CHECK(p.device() == first->device(), "AdamW: parameters on ", first->device(), " and ", p.device(),
                  " (one device per optimizer)");
      auto it = states.find(key_of(p));
      if (it == states.end()) {
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        it = states.emplace(key_of(p), std::move(state)).first;
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*it->second);
      at::Tensor& count = fused_steps_[p.unsafeGetTensorImpl()];
      if (!count.defined() || count.device() != p.device())  // new, or the parameter moved
        count = at::full({}, static_cast<double>(state.step()), at::TensorOptions().dtype(at::kFloat).device(p.device()));
      state.step(state.step() + 1);  // the host's count, for state(); the device's follows below
      params.push_back(p);
      grads.push_back(grad);
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      steps.push_back(count);
    }
    if (params.empty()) continue;
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, o.lr(), std::get<0>(o.betas()),
                      std::get<1>(o.betas()), o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false);
  }
  return true;
#else
  return false;
#endif
}

void AdamW::set_capturable(bool on) {
  if (on == capturable_) return;
  fused_steps_.clear();  // the counts are read from the states again
  auto& states = adamw_->state();
  if (on) {
    std::optional<int64_t> step;
    at::Tensor first;
    size_t i = 0;
    for (auto& group : adamw_->param_groups()) {
      for (auto& p : group.params()) {
        ++i;
        if (!first.defined()) first = p;
        if (p.device() != first.device())
          throw OptionError("capturable", "parameter " + std::to_string(i) + " is on " + p.device().str() +
                                              ", parameter 1 on " + first.device().str() + ": capturable mode needs one device");
        auto it = states.find(key_of(p));
        int64_t s = 0;
        if (it == states.end()) {
          auto state = std::make_unique<torch::optim::AdamWParamState>();
          state->step(0);
          state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
          state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
          states[key_of(p)] = std::move(state);
        } else {
          s = static_cast<const torch::optim::AdamWParamState&>(*it->second).step();
        }
        if (step && *step != s)
          throw OptionError("capturable", "parameters have different step counts (" + std::to_string(*step) + " and " +
                                              std::to_string(s) + " at parameter " + std::to_string(i) + ")");
        step = s;
      }
    }
    auto opts = at::TensorOptions().dtype(at::kDouble).device(first.device());
    step_t_ = at::full({}, static_cast<double>(step.value_or(0)), opts);
    lr_t_ = at::full({}, lr(), opts);
  } else {
    auto step = static_cast<int64_t>(step_t_.item<double>());
    for (auto& group : adamw_->param_groups())
      for (auto& p : group.params()) static_cast<torch::optim::AdamWParamState&>(*states.at(key_of(p))).step(step);
    step_t_ = lr_t_ = at::Tensor();
  }
  capturable_ = on;
}

// AdamW's update as LibTorch writes it (decoupled decay, moments, bias
// corrections), with the step count and learning rate read from tensors.
void AdamW::capturable_step() {
  at::NoGradGuard no_grad;
  step_t_.add_(1);
  auto& states = adamw_->state();
  for (auto& group : adamw_->param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    auto bias_correction1 = 1 - at::pow(beta1, step_t_);
    auto bias_correction2_sqrt = (1 - at::pow(beta2, step_t_)).sqrt();
    auto neg_step_size = -lr_t_ / bias_correction1;
    auto decay = 1 - lr_t_ * o.weight_decay();
    for (auto& p : group.params()) {
      const auto& grad = p.grad();
      if (!grad.defined()) continue;
      auto& state = static_cast<torch::optim::AdamWParamState&>(*states.at(key_of(p)));
      if (o.weight_decay() != 0) p.mul_(decay);
      state.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
      state.exp_avg_sq().mul_(beta2).addcmul_(grad, grad, 1 - beta2);
      auto denom = (state.exp_avg_sq().sqrt() / bias_correction2_sqrt).add_(o.eps());
      p.add_(state.exp_avg() / denom * neg_step_size);
    }
  }
}

void AdamW::zero_grad() {
  for (auto& group : adamw_->param_groups())
    for (auto& p : group.params()) p.mutable_grad() = at::Tensor();
}

void AdamW::set_lr(double lr) {
  if (!(lr >= 0)) throw OptionError("lr", "learning rate must be non-negative, got " + std::to_string(lr));
  for (auto& group : adamw_->param_groups()) group.options().set_lr(lr);
  if (capturable_) lr_t_.fill_(lr);
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
        int64_t step = capturable_ ? static_cast<int64_t>(step_t_.item<double>()) : s.step();
        out.push_back(ParamState{step, s.exp_avg(), s.exp_avg_sq()});
      }
    }
  }
  return out;
}

void AdamW::load_state(const std::vector<std::optional<ParamState>>& states) {
  fused_steps_.clear();
  bool was_capturable = capturable_;
  if (was_capturable) {  // the counts come from `states`: nothing to write back
    capturable_ = false;
    step_t_ = lr_t_ = at::Tensor();
  }
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
  if (was_capturable) set_capturable(true);
}

}  // namespace anatomy::optim

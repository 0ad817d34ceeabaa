// With STRATA_PROFILE=1 the fused CPU decode regions (quant_attn_decode, quant_ffn_decode) time
// their phases on thread 0 and print at exit the mean microseconds a call spends in each:
// streaming weights, the other work, and waiting at the barriers. The section table of
// STRATA_PROFILE times a whole region; this says where inside it a layer's time goes (issue 19:
// the 2-thread decode on the GPU machines' Xeon). Off, a region pays one branch per phase.
#pragma once

#include <array>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "core/env.h"

namespace strata::cpu {

class PhaseClock {
 public:
  static constexpr int kMaxPhases = 10;
  // `region` titles the printed line; `names` are the phases in order (at most kMaxPhases).
  // `on`: whether calls are timed (default: STRATA_PROFILE).
  template <size_t N>
  PhaseClock(const char* region, const std::array<const char*, N>& names,
             bool on = env_config().profile)
      : region_(region), n_(static_cast<int>(N)), on_(on) {
    static_assert(N <= kMaxPhases);
    for (size_t i = 0; i < N; ++i) names_[i] = names[i];
  }
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  ~PhaseClock() {
    if (calls_ == 0) return;
    std::fprintf(stderr, "strata: %s phases, thread 0, us per call (%lld calls):", region_,
                 static_cast<long long>(calls_));
    for (int i = 0; i < n_; ++i) std::fprintf(stderr, " %s %.2f", names_[i], us_[i] / calls_);
    std::fprintf(stderr, "\n");
  }
  bool on() const { return on_; }
  long long calls() const { return calls_; }
  double mean_us(int phase) const { return calls_ > 0 ? us_[phase] / calls_ : 0.0; }

  // One call's stamps, taken by one thread: the constructor starts phase 0, mark() ends the
  // current phase and starts the next, and the destructor adds the call to the clock (after
  // as many marks as phases).
  class Call {
   public:
    Call(PhaseClock& clock, bool take) : clock_(take && clock.on() ? &clock : nullptr) {
      if (clock_ != nullptr) last_ = Clock::now();
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    ~Call() {
      if (clock_ == nullptr || phase_ != clock_->n_) return;
      const std::lock_guard<std::mutex> lock(clock_->mu_);
      for (int i = 0; i < clock_->n_; ++i) clock_->us_[i] += us_[i];
      ++clock_->calls_;
    }
    void mark() {
      if (clock_ == nullptr || phase_ >= clock_->n_) return;
      const auto now = Clock::now();
      us_[phase_++] = std::chrono::duration<double, std::micro>(now - last_).count();
      last_ = now;
    }

   private:
    using Clock = std::chrono::steady_clock;
    PhaseClock* clock_;
    Clock::time_point last_;
    int phase_ = 0;
    double us_[kMaxPhases] = {};
  };

 private:
  const char* region_;
  const char* names_[kMaxPhases] = {};
  int n_;
  bool on_;
  std::mutex mu_;
  double us_[kMaxPhases] = {};
  long long calls_ = 0;
};

}  // namespace strata::cpu

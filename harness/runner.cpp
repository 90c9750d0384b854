// The runner: warmup, then the measured requests paced (open loop) and capped (closed loop),
// then the drain; every statistic is computed afterwards (statistics.cpp).
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "tandem/bench.h"

namespace tandem::bench {

RequestTracker::RequestTracker(BenchRequest request, std::function<void()> on_finish)
    : request_(std::move(request)), on_finish_(std::move(on_finish)) {
  record_.input_tokens = request_.input_tokens;
  // A server may stream a little more than asked (a final chunk); the slack avoids regrowth.
  token_times_.reserve(static_cast<size_t>(request_.max_tokens) + 8);
}

void RequestTracker::finish(Outcome outcome, std::string finish_reason, std::string error, uint32_t input_tokens,
                            uint32_t cached_tokens, uint32_t output_tokens) {
  if (done_.load(std::memory_order_relaxed)) return;
  finished_at_ = Clock::now();
  record_.outcome = outcome;
  record_.finish_reason = std::move(finish_reason);
  record_.error = std::move(error);
  if (input_tokens > 0) record_.input_tokens = input_tokens;
  record_.cached_tokens = cached_tokens;
  record_.output_tokens = output_tokens;
  done_.store(true, std::memory_order_release);
  if (on_finish_) on_finish_();
}

namespace {

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// What the trackers' on_finish (on the targets' threads) shares with the runner. Owned jointly:
// a request the drain gave up on may finish after run() returned.
struct Counters {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t in_flight = 0;  // guarded by mu
  uint64_t finished = 0;   // guarded by mu
};

// One run's stages, in order: warmup(), send(), drain(); then trackers() hold the measured requests.
class Runner {
 public:
  Runner(Target& target, const Workload& workload, const LoadOptions& load)
      : target_(target), workload_(workload), load_(load) {}

  // Its own requests, at the same concurrency cap (or one at a time), not counted.
  void warmup() {
    std::vector<std::shared_ptr<RequestTracker>> warm;
    const uint64_t cap = load_.concurrency > 0 ? load_.concurrency : 1;
    const auto deadline = Clock::now() + seconds(load_.drain_timeout_s);
    for (uint32_t i = 0; i < load_.warmup; ++i) {
      if (!wait_in_flight(cap - 1, deadline)) break;
      launch(~0ULL - i, warm);
    }
    (void)wait_in_flight(0, deadline);  // at once when there was no warmup
    std::lock_guard<std::mutex> lock(counters_->mu);
    counters_->finished = 0;
  }

  // The measured requests, until num_requests are sent or the duration is over. The clock
  // starts here (t0); with a rate, arrival gaps are gamma-distributed (shape = burstiness).
  void send() {
    if (load_.num_requests > 0) trackers_.reserve(load_.num_requests);
    std::mt19937_64 rng(load_.seed ^ 0xa11e55ULL);
    std::gamma_distribution<double> gap(load_.burstiness, load_.rate > 0 ? 1.0 / (load_.rate * load_.burstiness) : 1.0);
    t0_ = Clock::now();
    next_progress_ = t0_ + load_.progress_interval;
    const auto stop = load_.duration_s > 0 ? t0_ + seconds(load_.duration_s) : Clock::time_point::max();
    Clock::time_point arrival = t0_;
    for (uint64_t i = 0; load_.num_requests == 0 || i < load_.num_requests; ++i) {
      if (load_.rate > 0) {
        arrival += seconds(gap(rng));
        if (i == 0) arrival = t0_;  // the first request goes at once
      }
      if (!wait_turn(arrival, stop)) return;
      launch(i, trackers_);
    }
  }

  // Waits for the requests in flight, bounded by the drain timeout.
  void drain() {
    const auto deadline = Clock::now() + seconds(load_.drain_timeout_s);
    for (;;) {
      const auto now = Clock::now();
      report(now);
      if (now >= deadline) return;
      if (wait_in_flight(0, std::min(deadline, now + load_.progress_interval))) return;
    }
  }

  const std::vector<std::shared_ptr<RequestTracker>>& trackers() const { return trackers_; }
  Clock::time_point t0() const { return t0_; }

 private:
  void launch(uint64_t index, std::vector<std::shared_ptr<RequestTracker>>& into) {
    auto tracker = std::make_shared<RequestTracker>(workload_.make(index), [c = counters_] {
      {
        std::lock_guard<std::mutex> lock(c->mu);
        --c->in_flight;
        ++c->finished;
      }
      c->cv.notify_all();
    });
    {
      std::lock_guard<std::mutex> lock(counters_->mu);
      ++counters_->in_flight;
    }
    tracker->mark_sent();
    into.push_back(tracker);
    target_.start(std::move(tracker));
  }

  // Waits until at most `cap` requests are in flight, or `deadline`; false on the deadline.
  bool wait_in_flight(uint64_t cap, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(counters_->mu);
    return counters_->cv.wait_until(lock, deadline, [&] { return counters_->in_flight <= cap; });
  }

  // Waits until the next request may go: below the concurrency cap and at its `arrival` (with
  // a rate). False once `stop` has come. Bounded: each pass waits at most a progress interval.
  bool wait_turn(Clock::time_point arrival, Clock::time_point stop) {
    for (;;) {
      const auto now = Clock::now();
      report(now);
      if (now >= stop) return false;
      // A full concurrency cap waits for a slot, not for the arrival time (which may be past).
      const auto wake = std::min(now + load_.progress_interval, stop);
      if (load_.concurrency > 0) {
        std::unique_lock<std::mutex> lock(counters_->mu);
        if (counters_->in_flight >= load_.concurrency) {
          counters_->cv.wait_until(lock, wake, [&] { return counters_->in_flight < load_.concurrency; });
          continue;
        }
      }
      if (load_.rate > 0 && now < arrival) {
        std::this_thread::sleep_until(std::min(wake, arrival));
        continue;
      }
      return true;
    }
  }

  // Calls load.progress when due; tokens are read only from finished trackers (live ones
  // belong to the target).
  void report(Clock::time_point now) {
    if (!load_.progress || now < next_progress_) return;
    next_progress_ = now + load_.progress_interval;
    uint64_t done;
    {
      std::lock_guard<std::mutex> lock(counters_->mu);
      done = counters_->finished;
    }
    uint64_t tokens = 0;
    for (const auto& t : trackers_)
      if (t->finished()) {  // the server's usage count when it sent one, as the summary counts
        const uint32_t reported = t->record().output_tokens;
        tokens += reported > 0 ? reported : t->token_times().size();
      }
    const double secs = std::chrono::duration<double>(now - t0_).count();
    load_.progress(done, load_.num_requests, secs > 0 ? static_cast<double>(tokens) / secs : 0);
  }

  Target& target_;
  const Workload& workload_;
  const LoadOptions& load_;
  const std::shared_ptr<Counters> counters_ = std::make_shared<Counters>();
  std::vector<std::shared_ptr<RequestTracker>> trackers_;
  Clock::time_point t0_, next_progress_;
};

}  // namespace

Result<Summary> run(Target& target, const Workload& workload, const LoadOptions& load) {
  if (load.num_requests == 0 && load.duration_s <= 0)
    return Status::invalid("give --num-requests N and/or --duration S");
  if (load.rate <= 0 && load.concurrency == 0) return Status::invalid("give --rate R and/or --concurrency C");
  if (!(load.burstiness > 0)) return Status::invalid("--burstiness must be > 0");
  Runner runner(target, workload, load);
  runner.warmup();
  runner.send();
  runner.drain();
  Summary s = summarize(runner.trackers(), runner.t0(), load);
  s.target = target.describe();
  return s;
}

}  // namespace tandem::bench

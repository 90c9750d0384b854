#include "scheduler/status_reply.h"

#include <algorithm>
#include <vector>

namespace tandem::scheduler {

namespace {

void fill_worker(const Core::WorkerView& w, const ActorStatus& actor, v1::WorkerStatus& ws) {
  ws.set_worker_id(w.id);
  ws.set_alive(true);
  ws.set_kv_blocks_total(w.blocks_total);
  ws.set_kv_blocks_free(w.blocks_free);
  ws.set_running(w.running);
  ws.set_steps(w.stats->steps);
  ws.set_tokens(w.stats->tokens);
  const double busy = double(w.stats->idle_us + w.stats->compute_us);
  ws.set_idle_share(busy > 0 ? double(w.stats->idle_us) / busy : 0.0);
  ws.set_idle_us(w.stats->idle_us);
  ws.set_compute_us(w.stats->compute_us);
  ws.set_kv_blocks_cached(w.blocks_cached);
  ws.set_kv_evictions(w.evictions);
  ws.set_role(role_name(w.role));
  ws.set_spec_tokens(w.spec_tokens);
  ws.set_spec_rounds(w.stats->spec_rounds);
  ws.set_drafts(w.stats->drafted);
  ws.set_drafts_accepted(w.stats->accepted);
  ws.set_state_slots_total(w.state_slots_total);
  ws.set_state_slots_free(w.state_slots_free);
  ws.set_checkpoints_total(w.checkpoints_total);
  ws.set_checkpoints_free(w.checkpoints_free);
  ws.set_kv_ring_blocks_total(w.ring_total);
  ws.set_kv_ring_blocks_free(w.ring_free);
  ws.set_kv_ring_blocks_cached(w.ring_cached);
  if (std::optional<WorkerPeerInfo> peer = actor.peer ? actor.peer(w.id) : std::nullopt) {
    ws.set_pid(peer->pid);
    ws.set_weight_bytes(peer->weight_bytes);
    ws.set_kv_bytes(peer->kv_bytes);
    ws.set_last_heard_ms(
        static_cast<uint32_t>(std::clamp<int64_t>((actor.now_us - peer->last_seen_us) / 1000, 0, UINT32_MAX)));
  }
}

// Mean and 99th percentile of the handoff times kept; left unset when there are none.
void fill_handoff_times(const CoreStats& cs, v1::StatusReply& s) {
  if (cs.handoff_ms.empty()) return;
  std::vector<double> ms = cs.handoff_ms;
  double sum = 0;
  for (double x : ms) sum += x;
  const size_t k = std::min(ms.size() - 1, ms.size() * 99 / 100);
  std::nth_element(ms.begin(), ms.begin() + static_cast<ptrdiff_t>(k), ms.end());
  s.set_handoff_ms_mean(sum / double(ms.size()));
  s.set_handoff_ms_p99(ms[k]);
}

}  // namespace

void LastMinute::sample(const CoreStats& stats) {
  samples_.push_back({stats.tokens, stats.finished});
  if (samples_.size() > 60) samples_.pop_front();
}

LastMinute::Totals LastMinute::oldest(const CoreStats& stats) const {
  return samples_.empty() ? Totals{stats.tokens, stats.finished} : samples_.front();
}

void fill_status_reply(const Core& core, const ActorStatus& actor, v1::StatusReply& out) {
  out.Clear();
  out.set_query_id(actor.query_id);
  for (const Core::WorkerView& w : core.workers()) fill_worker(w, actor, *out.add_workers());
  const CoreStats& cs = core.stats();
  out.set_queued(core.queued());
  out.set_running(core.running());
  out.set_requests_total(cs.requests);
  out.set_requests_finished(cs.finished);
  out.set_tokens_generated(cs.tokens);
  out.set_steps(cs.steps);
  out.set_scheduler_cpu_ms_per_step(cs.steps ? double(actor.scheduler_cpu_us) / 1e3 / double(cs.steps) : 0.0);
  out.set_ready(core.ready());
  out.set_max_step_decode(cs.max_step_decode);
  out.set_max_step_prefill_tokens(cs.max_step_prefill_tokens);
  out.set_decode_stalls(cs.decode_stalls);
  out.set_preemptions(cs.preemptions);
  out.set_handoffs(cs.handoffs);
  out.set_handoff_bytes(cs.handoff_bytes);
  out.set_handoff_failures(cs.handoff_failures);
  out.set_prompt_tokens(cs.prompt_tokens);
  out.set_cached_prompt_tokens(cs.cached_prompt_tokens);
  out.set_prefix_hit_rate(cs.prompt_tokens ? double(cs.cached_prompt_tokens) / double(cs.prompt_tokens) : 0.0);
  fill_handoff_times(cs, out);
  out.set_draining(actor.draining);
  out.set_tokens_per_s_last_minute(double(cs.tokens - actor.minute_ago.tokens) / 60.0);
  out.set_requests_finished_last_minute(cs.finished - actor.minute_ago.finished);
  out.set_planning_stalls(actor.planning_stalls);
}

}  // namespace tandem::scheduler

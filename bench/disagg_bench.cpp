// tandem-disagg-bench: what splitting prefill and decode costs and buys, measured in one run.
//
//   tandem-disagg-bench [--model FILE] [--tandem PATH] [--positions 1024] [--reps 5]
//                       [--steady 8] [--long 4] [--long-len 1024] [--gap-ms 3000] [--skip-mixed]
//
// 1. KV transfer throughput: a sequence of --positions tokens of the model's KV (F32) moved
//    between two pools over ipc:// exactly as workers move it (pack_transfer: zero-copy
//    frames from the pool; unpack_transfer: one copy into the reserved blocks), against
//    ZeroMQ alone moving the same frames over ipc:// (no pool reads, no copy out), in
//    alternating repetitions.
// 2. A mixed workload on `--workers 2` and on `--prefill 1 --decode 1` (one thread per
//    worker both times): --steady streams decoding while --long prompts of --long-len
//    tokens arrive --gap-ms apart. Reported: p50/p99 inter-token latency of the steady
//    streams while the long prompts run, and p50/p99 time to first token of the long ones.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench/deployment.h"
#include "cli/args.h"
#include "runtime/wire.h"
#include "tandem/client.h"
#include "workers/engine/kv_cache.h"
#include "model/make_model.h"
#include "workers/kv_transfer.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

// Receives one multipart message.
size_t receive(zmq::socket_t& s, runtime::Frames& frames) {
  frames.clear();
  size_t bytes = 0;
  do {
    frames.emplace_back();
    (void)s.recv(frames.back());
    bytes += frames.back().size();
  } while (frames.back().more());
  return bytes;
}

void send_all(zmq::socket_t& s, runtime::Frames& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    (void)s.send(frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

void transfer_throughput(const model::ModelConfig& config, uint32_t positions, int reps) {
  const uint32_t blocks = (positions + 15) / 16;
  auto src = engine::KvPool::create(config, blocks).value();
  auto dst = engine::KvPool::create(config, blocks).value();
  for (uint32_t b = 0; b < blocks; ++b)  // touch every byte once so page faults are not measured
    for (uint32_t l = 0; l < src->n_layers(); ++l)
      for (uint32_t h = 0; h < src->n_kv_heads(); ++h)
        for (uint32_t kv = 0; kv < 2; ++kv)
          std::memset(src->block_data(l, h, kv, b), 1 + (b % 7), src->region_block_bytes(l));
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> dest(table.rbegin(), table.rend());  // scattered on purpose: one copy per block

  const std::string dir = std::filesystem::temp_directory_path() / ("tandem-kvbench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  zmq::context_t ctx;
  zmq::socket_t push(ctx, zmq::socket_type::push), pull(ctx, zmq::socket_type::pull);
  pull.set(zmq::sockopt::rcvhwm, 0);
  pull.bind("ipc://" + dir + "/kv.sock");
  push.connect("ipc://" + dir + "/kv.sock");

  // The receiver runs on its own thread, as the decode worker is its own process.
  std::vector<double> zmq_gbs, tandem_gbs;
  for (int rep = 0; rep < reps; ++rep) {
    for (int mode = 0; mode < 2; ++mode) {
      v1::KvTransfer header;
      header.set_version(1);
      header.set_positions(positions);
      runtime::Frames frames;
      worker::pack_transfer(*src, table, {}, header, frames);
      size_t received = 0;
      Status unpacked = Status::ok();
      const auto t0 = Clock::now();
      std::thread receiver([&] {
        runtime::Frames in;
        received = receive(pull, in);
        if (mode == 1) {
          v1::KvTransfer h;
          unpacked = runtime::parse_frame(in[0], h);
          if (unpacked) {
            auto r = worker::unpack_transfer(*dst, h, dest, {}, in);
            if (!r) unpacked = r.status();
          }
        }
      });
      send_all(push, frames);  // mode 0 measures the same frames through ZeroMQ alone
      receiver.join();
      const double s = seconds_since(t0);
      if (!unpacked) std::fprintf(stderr, "unpack failed: %s\n", unpacked.to_string().c_str());
      (mode == 0 ? zmq_gbs : tandem_gbs).push_back(double(received) / s / 1e9);
    }
  }
  std::filesystem::remove_all(dir);
  const double z = percentile(zmq_gbs, 0.5), t = percentile(tandem_gbs, 0.5);
  std::printf("KV transfer of %u positions (%.1f MB, %u blocks, %zu frames per message), median of %d:\n", positions,
              double(src->block_bytes()) * blocks / 1e6, blocks, 1 + size_t{config.n_layers} * config.n_kv_heads * 2,
              reps);
  std::printf("  ZeroMQ ipc:// alone:          %.2f GB/s\n", z);
  std::printf("  tandem handoff (pack+unpack): %.2f GB/s\n", t);
  std::printf("ratio: handoff / ZeroMQ ipc = %.2f\n", t / z);
}

struct Mixed {
  std::vector<double> itl_ms, ttft_ms;
  bool ok = true;
};

Mixed mixed(const std::string& tandem, const std::string& model, std::vector<std::string> workers, uint32_t steady,
            uint32_t n_long, uint32_t long_len, uint32_t gap_ms, uint32_t vocab) {
  Mixed m;
  bench::Deployment d(tandem, model, 1, std::move(workers));
  if (d.endpoint().empty()) {
    m.ok = false;
    return m;
  }
  auto client = Client::connect({d.endpoint()}).value();
  std::mutex mu;
  std::condition_variable cv;
  // Every steady stream's token arrival times; the long prompts' first-token times.
  std::vector<std::vector<Clock::time_point>> arrivals(steady);
  std::vector<Clock::time_point> submitted(n_long), first(n_long);
  uint32_t long_done = 0, steady_started = 0, steady_done = 0;
  auto prompt = [&](uint32_t len, uint32_t salt) {
    std::vector<int32_t> p(len);
    for (uint32_t i = 0; i < len; ++i) p[i] = 3 + static_cast<int32_t>((i * 7919 + salt * 104729) % (vocab - 3));
    return p;
  };
  std::vector<std::string> steady_ids;
  for (uint32_t i = 0; i < steady; ++i) {
    arrivals[i].reserve(4096);
    GenerateRequest r;
    r.prompt_tokens = prompt(32, i);
    r.max_tokens = 2000;
    r.ignore_eos = true;
    steady_ids.push_back(client->generate(r, [&, i](const Event& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.final) {
        ++steady_done;
        cv.notify_all();
        return;
      }
      if (arrivals[i].empty()) ++steady_started;
      arrivals[i].push_back(Clock::now());
      cv.notify_all();
    }));
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(60), [&] { return steady_started == steady; });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // every stream decoding
  const auto window0 = Clock::now();
  for (uint32_t j = 0; j < n_long; ++j) {
    GenerateRequest r;
    r.prompt_tokens = prompt(long_len, 100 + j);
    r.max_tokens = 8;
    r.ignore_eos = true;
    {
      std::lock_guard<std::mutex> lock(mu);
      submitted[j] = Clock::now();
    }
    client->generate(r, [&, j](const Event& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.final) {
        m.ok &= ev.fin.reason == FinishReason::kLength;
        ++long_done;
        cv.notify_all();
      } else if (first[j] == Clock::time_point{}) {
        first[j] = Clock::now();
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(300), [&] { return long_done == n_long; });
  }
  const auto window1 = Clock::now();
  for (const std::string& id : steady_ids) (void)client->cancel(id);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return steady_done == steady; });
    for (uint32_t i = 0; i < steady; ++i)
      for (size_t k = 1; k < arrivals[i].size(); ++k)
        if (arrivals[i][k] > window0 && arrivals[i][k] <= window1)
          m.itl_ms.push_back(std::chrono::duration<double, std::milli>(arrivals[i][k] - arrivals[i][k - 1]).count());
    for (uint32_t j = 0; j < n_long; ++j)
      m.ttft_ms.push_back(std::chrono::duration<double, std::milli>(first[j] - submitted[j]).count());
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "models/small-1.gguf";
  std::string tandem = (std::filesystem::path(argv[0]).parent_path() / "../cli/tandem").string();
  auto args = cli::Args::parse(argc - 1, argv + 1, cli::kDisaggBench);
  if (!args) return cli::fail("disagg-bench", args.status());
  model = args->str("model").value_or(model);
  tandem = args->str("tandem").value_or(tandem);
  uint32_t positions = 1024, reps = 5, steady = 8, n_long = 4, long_len = 1024, gap_ms = 3000;
  for (auto [flag, out] : {std::pair{"positions", &positions},
                           {"reps", &reps},
                           {"steady", &steady},
                           {"long", &n_long},
                           {"long-len", &long_len},
                           {"gap-ms", &gap_ms}}) {
    auto v = args->integer(flag, *out);
    if (!v) return cli::fail("disagg-bench", v.status());
    *out = static_cast<uint32_t>(*v);
  }
  const bool skip_mixed = args->has("skip-mixed");
  std::filesystem::create_directories("models");
  if (!std::filesystem::exists(model)) {
    if (Status st = model::make_model(*model::preset_config("small"), 1, model); !st) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
  }
  auto file = model::GgufFile::open(model);
  if (!file) {
    std::fprintf(stderr, "%s\n", file.status().to_string().c_str());
    return 1;
  }
  const model::ModelConfig config = model::read_model_config(**file).value();
  transfer_throughput(config, positions, static_cast<int>(reps));
  if (skip_mixed) return 0;

  std::printf(
      "\nmixed workload: %u steady streams decoding; %u prompts of %u tokens arriving %u ms apart; 1 thread per "
      "worker\n",
      steady, n_long, long_len, gap_ms);
  std::printf("%-26s %12s %12s %12s %12s %8s\n", "deployment", "ITL p50 ms", "ITL p99 ms", "TTFT p50 ms", "TTFT p99 ms",
              "ITLs");
  double p99[2] = {0, 0};
  int row = 0;
  for (auto [name, flags] :
       {std::pair{"--workers 2", std::vector<std::string>{"--workers", "2"}},
        std::pair{"--prefill 1 --decode 1", std::vector<std::string>{"--prefill", "1", "--decode", "1"}}}) {
    Mixed m = mixed(tandem, model, flags, steady, n_long, long_len, gap_ms, config.vocab_size);
    p99[row++] = percentile(m.itl_ms, 0.99);
    std::printf("%-26s %12.1f %12.1f %12.0f %12.0f %8zu%s\n", name, percentile(m.itl_ms, 0.5),
                percentile(m.itl_ms, 0.99), percentile(m.ttft_ms, 0.5), percentile(m.ttft_ms, 0.99), m.itl_ms.size(),
                m.ok ? "" : "  (a request failed or the deployment did not start!)");
  }
  std::printf("ratio: steady-stream ITL p99, split / both = %.2f\n", p99[0] > 0 ? p99[1] / p99[0] : 0.0);
  return 0;
}

// What the actors' fuzz harnesses share (scheduler::ActorHarness, worker::WorkerHarness): the
// harness owns an actor that was started (its sockets bound or connected) but whose loop never
// runs, and its calls feed the handlers the actor's sockets would call. The actor's class is
// only declared in the harness's header and defined in its .cpp, which must therefore also
// define the harness's constructor and destructor.
#pragma once

#include <memory>
#include <utility>

#include "runtime/status.h"

namespace tandem::runtime {

template <class Actor>
class Harness {
 public:
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

 protected:
  explicit Harness(std::unique_ptr<Actor> actor) : actor_(std::move(actor)) {}
  ~Harness() = default;

  // The harness H around the actor `started`, or why the actor did not start. H's constructor
  // takes the actor; it may be private if H befriends Harness<Actor>.
  template <class H>
  static Result<std::unique_ptr<H>> around(Result<std::unique_ptr<Actor>> started) {
    if (!started) return started.status();
    return std::unique_ptr<H>(new H(std::move(started.value())));
  }

  Actor& actor() { return *actor_; }

 private:
  std::unique_ptr<Actor> actor_;
};

}  // namespace tandem::runtime

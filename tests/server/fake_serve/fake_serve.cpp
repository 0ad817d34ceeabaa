// strata_fake_serve PORT [API_KEY]: the real HTTP/OpenAI layer over FakeServingEngine, so the
// Python `openai` client can be tested against the server before the real engine exists
// (tests/server/test_openai_fake.py). Prints "listening PORT" once ready; SIGTERM stops it.
#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "../fake_engine.h"
#include "server/http_server.h"
#include "server/openai_routes.h"

int main(int argc, char** argv) {
  using namespace strata::server;
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  auto engine = std::make_shared<strata::testing::FakeServingEngine>(std::chrono::milliseconds(2));
  auto routes = std::make_shared<OpenAIRoutes>(OpenAIOptions{argc > 2 ? argv[2] : ""});
  routes->set_engine(engine);
  HttpServerOptions opt;
  opt.port = static_cast<uint16_t>(argc > 1 ? std::atoi(argv[1]) : 0);
  auto server = HttpServer::create(
      opt,
      [routes](HttpRequest req, std::shared_ptr<Responder> r) {
        routes->handle(std::move(req), std::move(r));
      },
      &OpenAIRoutes::transport_error);
  if (!server.ok()) {
    std::fprintf(stderr, "fake_serve: %s\n", server.status().message().c_str());
    return 1;
  }
  (*server)->start();
  std::printf("listening %u\n", static_cast<unsigned>((*server)->port()));
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  (*server)->stop_accepting();
  engine->shutdown(false);
  (*server)->stop();
  return 0;
}

// The strata binary on bad input: one line "strata: error: ..." naming the file, tensor or
// field; exit status 1; no crash (a crash would show as a signal or an ASan report).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;
  std::string err;  // stderr
  std::string out;  // stdout
};

// `timeout_s` > 0: killed after that many seconds (exit 124), for inputs that used to hang.
CliRun run_strata(const std::string& args, int timeout_s = 0) {
  static int counter = 0;
  const std::string err_file =
      fs::temp_directory_path() /
      ("strata_cli_err_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  const std::string prefix =
      timeout_s > 0 ? "timeout -k 2 " + std::to_string(timeout_s) + " " : std::string();
  const std::string cmd = prefix + std::string(STRATA_BINARY) + " " + args + " 2>" + err_file;
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), {});
  fs::remove(err_file);
  return r;
}

std::string fixture(const std::string& name) {
  return std::string(STRATA_FIXTURE_DIR) + "/models/" + name;
}

// A scratch copy of a fixture model that a test may damage.
class ScratchModel {
 public:
  explicit ScratchModel(const std::string& name) {
    char tmpl[] = "/tmp/strata_cli_XXXXXX";
    dir_ = mkdtemp(tmpl);
    for (const auto& e : fs::directory_iterator(fixture(name))) {
      fs::copy(e.path(), dir_ / e.path().filename());
    }
  }
  ~ScratchModel() { fs::remove_all(dir_); }
  std::string path() const { return dir_.string(); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(dir_ / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  fs::path dir_;
};

void expect_clean_error(const CliRun& r, const std::string& must_contain) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
  // One line.
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos)
      << "'" << must_contain << "' not in: " << r.err;
}

TEST(Cli, RunGeneratesText) {
  CliRun r = run_strata("run -m " + fixture("llama") + " -p 'The license is' -n 8 --temp 0 -q");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

TEST(Cli, InfoPrintsArchitecture) {
  CliRun r = run_strata("info -m " + fixture("qwen2"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Qwen2ForCausalLM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters"), std::string::npos);
}

TEST(Cli, PlanFlagErrors) {
  expect_clean_error(run_strata("bench --model-config llama3-8b --plan auto -b 1"),
                     "--plan needs --device cuda");
  expect_clean_error(
      run_strata("bench --model-config llama3-8b --device cuda --plan auto --tp 2 -b 1"),
      "drop --tp / --pp");
  expect_clean_error(
      run_strata("bench --model-config llama3-8b --device cuda --plan auto --ffn-layout 2d -b 1"),
      "drop --ffn-layout");
  expect_clean_error(run_strata("bench --model-config llama3-8b --device cuda --plan auto "
                                "--ffn-gather-min-tokens 512 -b 1"),
                     "drop --ffn-layout / --ffn-gather-min-tokens");
}

// --ffn-gather-min-tokens: weight-gathered prefill with 1d decode, for tensor-parallel ranks.
TEST(Cli, FfnGatherFlagErrors) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --ffn-gather-min-tokens 4"),
                     "--ffn-gather-min-tokens 4 needs --tensor-parallel-size > 1");
  expect_clean_error(run_strata("run -m " + fixture("llama") +
                                " -p hi --tp 2 --ffn-layout 2d --ffn-gather-min-tokens 4"),
                     "--ffn-gather-min-tokens 4 goes with --ffn-layout 1d");
  expect_clean_error(run_strata("bench --model-config llama3-8b --device cuda --tp 2 "
                                "--quantization int8 --ffn-gather-min-tokens 512 -b 1"),
                     "--quantization int8 is not built for it yet");
}

// --dp: data-parallel replicas run on GPUs (the CPU replicas are the library's, for tests), not
// combined with the other parallelisms yet.
TEST(Cli, DataParallelFlagErrors) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --dp 2"),
                     "--data-parallel-size > 1 needs --device cuda");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --dp 0"),
                     "--data-parallel-size 0 must be >= 1");
  expect_clean_error(run_strata("bench --model-config llama3-8b --device cuda --dp 2 --tp 2 -b 1"),
                     "--data-parallel-size with --tp, --pp, --ep or mpirun is not built yet");
}

TEST(Cli, MissingModelDirectory) {
  expect_clean_error(run_strata("run -m /nonexistent/model -p hi"), "/nonexistent/model");
}

TEST(Cli, UnsupportedArchitecture) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  cfg.replace(cfg.find("LlamaForCausalLM"), 16, "FooBarForCausalLM");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "FooBarForCausalLM");
}

TEST(Cli, MalformedConfig) {
  ScratchModel m("llama");
  m.write("config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": ");
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "config.json");
}

TEST(Cli, ConfigFieldWrongType) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  const size_t at = cfg.find("\"hidden_size\": 64");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 17, "\"hidden_size\": \"64\"");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "hidden_size");
}

TEST(Cli, MissingTensor) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  const size_t at = cfg.find("\"num_hidden_layers\": 3");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 22, "\"num_hidden_layers\": 4");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "model.layers.3.");
}

TEST(Cli, TruncatedSafetensors) {
  ScratchModel m("llama");
  const std::string data = m.read("model.safetensors");
  m.write("model.safetensors", data.substr(0, data.size() / 2));
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "model.safetensors");
}

TEST(Cli, CorruptSafetensorsHeaderLength) {
  ScratchModel m("llama");
  std::string data = m.read("model.safetensors");
  for (int i = 0; i < 8; ++i) data[static_cast<size_t>(i)] = static_cast<char>(0x7f);
  m.write("model.safetensors", data);
  expect_clean_error(run_strata("run -m " + m.path() + " -p hi"), "model.safetensors");
}

TEST(Cli, PromptLongerThanContext) {
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "the license is ";
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -c 16 -p '" + prompt + "'"),
                     "context length");
}

TEST(Cli, BadSamplingFlag) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --top-p 1.5"), "top_p");
}

TEST(Cli, TensorParallelWithoutMpi) {
  CliRun r = run_strata("run -m " + fixture("llama") + " -p hi --tensor-parallel-size 2");
  // Either MPI is missing from the build, or the world size does not match: a clean error.
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
}

// --expert-parallel-size: without mpirun on the CPU, with pipeline stages, below 1: one line
// naming the flag.
TEST(Cli, ExpertParallelFlags) {
  const std::string moe = std::string(STRATA_FIXTURE_DIR) + "/moe/qwen2_moe";
  expect_clean_error(run_strata("run -m " + moe + " -p hi --expert-parallel-size 2"),
                     "--expert-parallel-size 2 needs 2 ranks");
  expect_clean_error(run_strata("run -m " + moe + " -p hi --ep 2 --pp 2"),
                     "--expert-parallel-size with --pipeline-parallel-size > 1 is not built yet");
  expect_clean_error(run_strata("run -m " + moe + " -p hi --ep 0"),
                     "--expert-parallel-size 0 must be >= 1");
}

// Weight streaming's flags: bad values and a budget too small are one line with the numbers; the
// plan is printed by `strata info` without a GPU.
TEST(Cli, WeightStreamingFlags) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --offload-weights nvme"),
                     "--offload-weights 'nvme'");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --gpu-weight-budget -1"),
                     "--gpu-weight-budget '-1'");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --gpu-weight-budget 4"),
                     "need --device cuda");
  expect_clean_error(run_strata("info --model-config llama-34b --gpu-weight-budget 1"),
                     "--gpu-weight-budget 1.00 GiB is too small");
  CliRun r = run_strata("info --model-config llama-34b --gpu-weight-budget 8");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layers 0-2: resident"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers 3-47: host"), std::string::npos) << r.out;
  r = run_strata("info -m " + fixture("llama") + " --offload-weights disk");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layers 0-2: disk"), std::string::npos) << r.out;
}

TEST(Cli, BenchEngineTable) {
  CliRun r = run_strata("bench -m " + fixture("llama") +
                        " --batch 1,3 --ctx 20 --decode-steps 4 --prefill 2x16 -p 8 -r 1 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // JSON rows: two decode batches, one prefill, one ttft.
  for (const char* key :
       {"\"decode\"", "\"prefill\"", "\"ttft\"", "\"ms_per_step\"", "\"TFLOPs\""}) {
    EXPECT_NE(r.out.find(key), std::string::npos) << key << " missing in " << r.out;
  }
}

TEST(Cli, BenchBadPrefillSpec) {
  expect_clean_error(run_strata("bench -m " + fixture("llama") + " --prefill 2by16"), "2by16");
}

TEST(Cli, DeviceErrors) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --device tpu"), "tpu");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --quantization int4"),
                     "int4");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --quantization int8"),
                     "--device cuda");
  // Without a GPU (CI) or without CUDA in the build: one clear line either way. With a GPU the
  // unsupported-architecture message is the clean error.
  CliRun r = run_strata("run -m " + fixture("gpt2") + " -p hi --device cuda");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  expect_clean_error(run_strata("bench --model-config llama9-1t --batch 1 --device cuda"),
                     "llama9-1t");
}

// ---- issue 16: hardening --------------------------------------------------------------------

// Item 4: a FIFO in place of a model file made strata wait forever for a writer.
TEST(Cli, FifoModelFilesFailFast) {
  for (const char* name : {"model.safetensors", "config.json", "tokenizer.json"}) {
    ScratchModel m("llama");
    fs::remove(m.file(name));
    ASSERT_EQ(mkfifo(m.file(name).c_str(), 0600), 0);
    const CliRun r = run_strata("run -m " + m.path() + " -p hi -n 2 -q", /*timeout_s=*/20);
    expect_clean_error(r, name);
    EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
  }
}

// Item 5: --threads is bounded (10,000 threads made no progress) and never negative.
TEST(Cli, ThreadsOutOfRange) {
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi -t 10000"),
                     "--threads 10000 must be in [0, ");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --threads=-5"),
                     "--threads -5");
  expect_clean_error(run_strata("serve -m " + fixture("llama") + " --port 0 -t 10000", 20),
                     "--threads 10000");
}

// Item 9: a seed of 2^64 or more is an error, not 2^64 - 1.
TEST(Cli, SeedOutOfRange) {
  expect_clean_error(
      run_strata("run -m " + fixture("llama") + " -p hi -n 2 -s 18446744073709551616"),
      "--seed '18446744073709551616'");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi -n 2 --seed=-1"),
                     "--seed '-1'");
  const CliRun ok =
      run_strata("run -m " + fixture("llama") + " -p hi -n 2 -q -s 18446744073709551615");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

// Item 9: serve's --timeout 0 would drop every connection at once.
TEST(Cli, ServeTimeoutMustBePositive) {
  expect_clean_error(run_strata("serve -m " + fixture("llama") + " --port 0 --timeout 0", 20),
                     "--timeout 0 must be > 0");
  expect_clean_error(run_strata("serve -m " + fixture("llama") + " --port 0 --http-threads 0", 20),
                     "--http-threads 0");
}

// Item 16: CLI11's own errors in the house style (exit 1, not 104/106/109).
TEST(Cli, ParseErrorsInHouseStyle) {
  expect_clean_error(run_strata("run -m " + fixture("llama")), "-p TEXT or -f FILE");  // no prompt
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p a -f b"), "excludes");
  expect_clean_error(run_strata("run -p hi"), "--model");  // required
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi --bogus"), "--bogus");
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -p hi -n lots"), "lots");
  expect_clean_error(run_strata("nosuchcommand"), "nosuchcommand");
  expect_clean_error(run_strata(""), "subcommand");
  const CliRun help = run_strata("run --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--prompt"), std::string::npos);
}

// Item 16: sampling values are checked before a model is loaded (here: none exists).
TEST(Cli, SamplingCheckedBeforeLoad) {
  expect_clean_error(run_strata("run -m /nonexistent/model -p hi --top-p 1.5"), "top_p");
  expect_clean_error(run_strata("run -m /nonexistent/model -p hi --temp -1"), "temperature");
  expect_clean_error(run_strata("run -m /nonexistent/model -p hi --min-p 2"), "min_p");
}

// Item 16: a name that is neither a path nor an alias lists the aliases.
TEST(Cli, UnknownModelNameListsAliases) {
  const CliRun r = run_strata("run -m smolm2 -p hi");
  expect_clean_error(r, "smolm2");
  EXPECT_NE(r.err.find("smollm2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("gemma3-270m"), std::string::npos) << r.err;
}

// Item 9: eos_token_id outside the vocabulary (431 tokens) is refused at load.
TEST(Cli, EosTokenOutsideVocabulary) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  const size_t at = cfg.find("\"eos_token_id\": 2");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 17, "\"eos_token_id\": 431");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("info -m " + m.path()), "eos_token_id 431");
}

// Item 8: a rotary dimension the kernels cannot take fails `info` (at load), not the first run.
TEST(Cli, RotaryDimensionCheckedAtLoad) {
  ScratchModel m("llama");
  std::string cfg = m.read("config.json");
  const size_t at = cfg.find("\"head_dim\": 16");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 14, "\"head_dim\": 2048");
  m.write("config.json", cfg);
  expect_clean_error(run_strata("info -m " + m.path()), "rotary dimension 2048");
}

// Item 11: the automatic context covers the default lengths (here tg128 with -p 8 on a 256-token
// fixture: it was sized to 8 and refused), and -p/-n take comma lists as documented.
TEST(Cli, BenchDefaultsAndLists) {
  CliRun r = run_strata("bench -m " + fixture("llama") + " -p 8 -r 1 -t 1 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"tg128\""), std::string::npos) << r.out;
  r = run_strata("bench -m " + fixture("llama") + " -p 16,32 -n 4,8 -r 1 -t 1 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* test : {"\"pp16\"", "\"pp32\"", "\"tg4\"", "\"tg8\""}) {
    EXPECT_NE(r.out.find(test), std::string::npos) << test << " missing in " << r.out;
  }
  // A length of 0 skips that test, as in llama-bench; all of them 0 is an error.
  r = run_strata("bench -m " + fixture("llama") + " -p 0 -n 4 -r 1 -t 1 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"tg4\""), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"pp"), std::string::npos) << r.out;
  r = run_strata("bench -m " + fixture("llama") + " -p 16 -n 0 -r 1 -t 1 --json -");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"pp16\""), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\"tg"), std::string::npos) << r.out;
  expect_clean_error(run_strata("bench -m " + fixture("llama") + " -p 0 -n 0"), "nothing to run");
  expect_clean_error(run_strata("bench -m " + fixture("llama") + " -n -1"), "-n lengths");
}

// Item 17: -f FILE reads the prompt; without -s the seed is random and printed.
TEST(Cli, PromptFileAndPrintedSeed) {
  const std::string file =
      (fs::temp_directory_path() / ("strata_prompt_" + std::to_string(getpid()))).string();
  std::ofstream(file) << "The license is\n";
  const CliRun f = run_strata("run -m " + fixture("llama") + " -f " + file + " -n 4 --temp 0 -q");
  const CliRun p =
      run_strata("run -m " + fixture("llama") + " -p 'The license is' -n 4 --temp 0 -q");
  fs::remove(file);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(f.out, p.out);  // the same prompt, the trailing newline dropped
  expect_clean_error(run_strata("run -m " + fixture("llama") + " -f /nonexistent/prompt.txt"),
                     "/nonexistent/prompt.txt");
  const CliRun s = run_strata("run -m " + fixture("llama") + " -p hi -n 2");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.err.find("strata: seed "), std::string::npos) << s.err;
}

// Item 17: `strata serve MODEL` as `vllm serve MODEL` (a check that fails before listening shows
// the positional model was taken).
TEST(Cli, ServeTakesThePositionalModel) {
  expect_clean_error(run_strata("serve " + fixture("llama") + " --port 0 --timeout 0", 20),
                     "--timeout 0");
  expect_clean_error(run_strata("serve --port 0", 20), "a model is required");
  expect_clean_error(run_strata("serve /nonexistent/model --port 0 -t 10000", 20), "--threads");
}

// Item 13: Ctrl-C at the chat prompt quits cleanly (it killed the program), and a reply cut by
// -n says so.
TEST(Cli, ChatCtrlCAndLengthNotice) {
  int in_pipe[2], err_pipe[2];
  ASSERT_EQ(pipe(in_pipe), 0);
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in_pipe[0], 0);
    dup2(err_pipe[1], 2);
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    close(in_pipe[1]);
    close(err_pipe[0]);
    const std::string model = fixture("llama");
    execl(STRATA_BINARY, STRATA_BINARY, "chat", "-m", model.c_str(), "-n", "3", "--temp", "0",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in_pipe[0]);
  close(err_pipe[1]);
  std::string err;
  auto read_until = [&](const std::string& what) {
    char buf[512];
    while (err.find(what) == std::string::npos) {
      pollfd pfd{err_pipe[0], POLLIN, 0};
      if (poll(&pfd, 1, 15000) <= 0) return false;  // nothing for 15 s
      const ssize_t n = read(err_pipe[0], buf, sizeof buf);
      if (n <= 0) return false;
      err.append(buf, static_cast<size_t>(n));
    }
    return true;
  };
  ASSERT_TRUE(read_until("strata chat:")) << err;  // loaded, at the prompt
  const std::string line = "The license is\n";
  ASSERT_EQ(write(in_pipe[1], line.data(), line.size()), static_cast<ssize_t>(line.size()));
  EXPECT_TRUE(read_until("(reply stopped at -n 3 tokens)")) << err;
  usleep(200 * 1000);  // back at the prompt, blocked reading
  kill(pid, SIGINT);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 100 && (done = waitpid(pid, &status, WNOHANG)) == 0; ++i) usleep(50 * 1000);
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "chat did not quit on Ctrl-C at the prompt";
  }
  close(in_pipe[1]);
  close(err_pipe[0]);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  if (WIFEXITED(status)) EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Item 17: memory flags take units (a later check failing shows the size parsed).
TEST(Cli, MemoryFlagsTakeUnits) {
  expect_clean_error(run_strata("serve " + fixture("llama") +
                                    " --port 0 --kv-cache-bytes 4MiB --swap-space-bytes 1.5GiB "
                                    "--swap-space 0.5 --timeout 0",
                                20),
                     "--timeout 0");
  expect_clean_error(run_strata("serve " + fixture("llama") + " --port 0 --kv-cache-bytes 4XB", 20),
                     "--kv-cache-bytes '4XB'");
  expect_clean_error(
      run_strata("serve " + fixture("llama") + " --port 0 --swap-space-bytes 1.5", 20),
      "--swap-space-bytes '1.5'");
}

// Item 17: one log line per request (method, path, status, tokens, latency).
TEST(Cli, ServeLogsOneLinePerRequest) {
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(err_pipe[1], 2);
    close(err_pipe[0]);
    const std::string model = fixture("llama");
    execl(STRATA_BINARY, STRATA_BINARY, "serve", model.c_str(), "--port", "0",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err_pipe[1]);
  std::string err;
  auto read_until = [&](const std::string& what) {
    char buf[512];
    while (err.find(what) == std::string::npos) {
      pollfd pfd{err_pipe[0], POLLIN, 0};
      if (poll(&pfd, 1, 15000) <= 0) return false;
      const ssize_t n = read(err_pipe[0], buf, sizeof buf);
      if (n <= 0) return false;
      err.append(buf, static_cast<size_t>(n));
    }
    return true;
  };
  bool ok = read_until("strata: ready");
  const size_t at = err.find("http://127.0.0.1:");
  const int port = at == std::string::npos ? 0 : std::atoi(err.c_str() + at + 17);
  if (ok && port > 0) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    const std::string body = R"({"prompt": "hi", "max_tokens": 3, "temperature": 0})";
    const std::string req =
        "POST /v1/completions HTTP/1.0\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    ok = ok && write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size());
    char buf[4096];
    while (ok && read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
    ok = ok && read_until("strata: POST /v1/completions 200 3 tokens ");
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  close(err_pipe[0]);
  EXPECT_TRUE(ok) << err;
  EXPECT_NE(err.find(" ms\n", err.find("POST /v1/completions 200")), std::string::npos) << err;
}

// Item 17: bench-serve takes vLLM's spellings; the server named by --base-url is the one tried.
TEST(Cli, BenchServeTakesVllmFlags) {
  const CliRun r = run_strata(
      "bench-serve --base-url http://127.0.0.1:1/v1 --dataset-name random --random-input-len 8 "
      "--random-output-len 4 --random-range-ratio 0.5 --num-prompts 1",
      20);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("strata: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
  expect_clean_error(run_strata("bench-serve --base-url ftp://x --num-prompts 1", 20),
                     "--base-url 'ftp://x'");
  expect_clean_error(run_strata("bench-serve --base-url http://h:1 --port 2", 20), "excludes");
  expect_clean_error(run_strata("bench-serve --port 1 --timeout 0", 20), "--timeout must be > 0");
}

// Item 14: a model without a chat template (a base model) runs --chat on the plain prompt,
// with a warning, instead of failing.
TEST(Cli, ChatWithoutTemplateFallsBackToPlainText) {
  ScratchModel m("llama");
  std::string cfg = m.read("tokenizer_config.json");
  const size_t at = cfg.find("\"chat_template\"");
  ASSERT_NE(at, std::string::npos);
  cfg.replace(at, 15, "\"no_chat_template\"");
  m.write("tokenizer_config.json", cfg);
  const CliRun r =
      run_strata("run -m " + m.path() + " --chat -p 'The license is' -n 4 --temp 0 -q");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
  EXPECT_FALSE(r.out.empty());
}

TEST(Cli, BenchThroughputRunsAllRequests) {
  const std::string json =
      (fs::temp_directory_path() / ("strata_tput_" + std::to_string(getpid()) + ".json")).string();
  CliRun r = run_strata(
      "bench-throughput -m " + fixture("llama") +
      " --num-prompts 40 --input-len 12 --output-len 5 --max-num-seqs 8 --warmup 3 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  fs::remove(json);
  EXPECT_NE(text.find("\"output_tokens\": 200"), std::string::npos) << text;  // 40 x 5
  EXPECT_NE(r.out.find("output tokens/s"), std::string::npos) << r.out;
}

// --kv-offload: a device pool of 12 blocks (6 sequences of 32 tokens) and 24 sequences
// running at once; the batch reached and the offload counters are reported; bad combinations
// are one-line errors.
TEST(Cli, BenchThroughputKvOffloadReportsTheBatch) {
  const std::string json =
      (fs::temp_directory_path() / ("strata_kvoff_" + std::to_string(getpid()) + ".json")).string();
  CliRun r = run_strata("bench-throughput -m " + fixture("llama") +
                        " --num-prompts 24 --input-len 20 --output-len 12 --max-num-seqs 24 "
                        "--warmup 0 --num-kv-blocks 12 --block-size 8 --kv-offload "
                        "--kv-host-gib 64MiB --json " +
                        json);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(json);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  fs::remove(json);
  EXPECT_NE(text.find("\"output_tokens\": 288"), std::string::npos) << text;  // 24 x 12
  EXPECT_NE(text.find("\"batch_reached\": 24"), std::string::npos) << text;
  EXPECT_NE(text.find("\"kv_offload\": true"), std::string::npos) << text;
  EXPECT_NE(r.out.find("Batch reached: 24"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV offload:"), std::string::npos) << r.out;

  const CliRun groups =
      run_strata("bench-throughput -m " + fixture("llama") + " --kv-offload --kv-offload-groups 1");
  EXPECT_EQ(groups.exit_code, 1);
  EXPECT_NE(groups.err.find("--kv-offload-groups must be >= 2"), std::string::npos) << groups.err;
  const CliRun pp = run_strata("bench-throughput -m " + fixture("llama") +
                               " --num-prompts 2 --warmup 0 --kv-offload --pp 2");
  EXPECT_EQ(pp.exit_code, 1);
  EXPECT_NE(pp.err.find("--kv-offload runs on one rank"), std::string::npos) << pp.err;
}

// `strata info` on mixture-of-experts models: the experts and top-k of a checkpoint and of a
// --model-config preset.
TEST(CliInfo, PrintsExpertsAndTopK) {
  const CliRun ck = run_strata("info -m " + std::string(STRATA_FIXTURE_DIR) + "/moe/qwen2_moe");
  EXPECT_EQ(ck.exit_code, 0) << ck.err;
  EXPECT_NE(ck.out.find("experts        8, top-k 2, expert ffn 20 (2 of 3 layers sparse)"),
            std::string::npos)
      << ck.out;
  EXPECT_NE(ck.out.find("shared expert  ffn 28"), std::string::npos) << ck.out;
  const CliRun q3 = run_strata("info --model-config qwen3-30b-a3b");
  EXPECT_EQ(q3.exit_code, 0) << q3.err;
  EXPECT_NE(q3.out.find("experts        128, top-k 8, expert ffn 768 (48 of 48 layers sparse)"),
            std::string::npos)
      << q3.out;
  const CliRun dense = run_strata("info -m " + fixture("llama"));
  EXPECT_EQ(dense.exit_code, 0) << dense.err;
  EXPECT_EQ(dense.out.find("experts"), std::string::npos) << dense.out;
}

}  // namespace

// ---- strata plan ---------------------------------------------------------------------------

TEST(CliPlan, PrintsRankedLayoutsForAFixtureCheckpoint) {
  // -m reads only the config; the tiny fixture plans on 4 devices.
  const CliRun r = run_strata("plan -m " + fixture("llama") + " --gpus 4 --top 3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode ("), std::string::npos) << r.out;
}

TEST(CliPlan, JsonHasBothPhases) {
  const CliRun r = run_strata(
      "plan --model-config palm-540b-padded --profile tpu-v4 --gpus 64 --weights int8 "
      "--workload prompt=2048,gen=64,batch=64 --json --top 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"prefill\""), std::string::npos);
  EXPECT_NE(r.out.find("\"decode\""), std::string::npos);
  EXPECT_NE(r.out.find("\"mfu\""), std::string::npos);
}

TEST(CliPlan, BadInputIsOneLine) {
  expect_clean_error(run_strata("plan --model-config llama3-8b --profile nope"),
                     "--profile 'nope'");
  expect_clean_error(run_strata("plan --model-config llama3-8b --workload prompt=x"), "--workload");
  expect_clean_error(run_strata("plan --model-config llama3-8b --workload size=3"), "size=3");
  expect_clean_error(run_strata("plan --model-config llama3-8b --weights q4"), "q4");
  expect_clean_error(run_strata("plan --model-config no-such"), "no-such");
  expect_clean_error(run_strata("plan"), "--model-config");
  expect_clean_error(run_strata("plan --model-config llama3-8b --gpus 0"), "--gpus 0");
}

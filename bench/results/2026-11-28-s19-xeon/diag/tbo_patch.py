# Adds SmolLM2-135M decode shapes to test-backend-ops' perf cases; threads from TBO_THREADS.
import sys
p = sys.argv[1]
s = open(p).read()
anchor = "static std::vector<std::unique_ptr<test_case>> make_test_cases_perf() {\n    std::vector<std::unique_ptr<test_case>> test_cases;\n"
assert anchor in s, "anchor"
add = """    for (auto t : {GGML_TYPE_Q4_1, GGML_TYPE_Q8_0}) {
        for (auto mk : std::vector<std::pair<int,int>>{{1536, 576}, {576, 1536}, {576, 576}, {960, 576}, {49152, 576}}) {
            test_cases.emplace_back(new test_mul_mat(t, GGML_TYPE_F32, mk.first, 1, mk.second, {1, 1}, {1, 1}));
        }
    }
"""
s = s.replace(anchor, anchor + add)
old = "ggml_backend_set_n_threads_fn(backend.get(), std::max<int>(1, N_THREADS/2));"
assert old in s, "threads"
s = s.replace(old, "ggml_backend_set_n_threads_fn(backend.get(), getenv(\"TBO_THREADS\") ? atoi(getenv(\"TBO_THREADS\")) : std::max<int>(1, N_THREADS/2));")
open(p, "w").write(s)

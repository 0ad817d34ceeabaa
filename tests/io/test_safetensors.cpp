// safetensors reader/writer and Checkpoint: round trips, and every kind of bad input producing
// a one-line error that names the file and the tensor. Files are crafted byte by byte here, so
// the tests need nothing outside the repository.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/half.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// u64 LE header length + header + data.
std::string st_bytes(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(n & 0xff);
  return out + header + data;
}

// Pads a header with spaces to a multiple of 8 bytes, as the reference writer does.
std::string pad8(std::string header) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

template <class T>
void expect_error(const Result<T>& r, StatusCode code, std::initializer_list<std::string> parts) {
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << *parts.begin() << "'";
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  const std::string& msg = r.status().message();
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  for (const std::string& p : parts) {
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::temp_directory_path() /
            (std::string("strata_st_") + std::to_string(::getpid()) + "_" + info->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // Writes a crafted file and returns its path.
  std::string craft(const std::string& name, const std::string& header,
                    const std::string& data = "") {
    const std::string p = path(name);
    write_file(p, st_bytes(header, data));
    return p;
  }

  std::string dir_;
};

// ---- round trips ---------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripAllStrataDtypes) {
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
  std::vector<uint16_t> bf16 = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f), f32_to_bf16(2.0f),
                                f32_to_bf16(3.0f)};
  std::vector<uint16_t> f16 = {f32_to_f16(0.25f), f32_to_f16(-8.0f)};
  std::vector<int8_t> i8 = {-128, 0, 127};
  std::vector<uint8_t> u8 = {1, 2, 3, 4, 5};
  std::vector<uint8_t> fp8 = {0x38, 0xb8, 0x00};
  std::vector<int32_t> i32 = {-7, 1 << 30};
  std::vector<int64_t> i64 = {int64_t{1} << 40, -3};
  float scalar = 42.0f;

  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"u8", Tensor::make(u8.data(), DType::kU8, {5})},  // odd size first: writer must realign
      {"f32", Tensor::make(f32.data(), DType::kF32, {2, 3})},
      {"bf16", Tensor::make(bf16.data(), DType::kBF16, {2, 2})},
      {"f16", Tensor::make(f16.data(), DType::kF16, {1, 1, 1, 2})},
      {"i8", Tensor::make(i8.data(), DType::kI8, {3})},
      {"fp8", Tensor::make(fp8.data(), DType::kFP8E4M3, {3, 1})},
      {"i32", Tensor::make(i32.data(), DType::kI32, {2})},
      {"i64", Tensor::make(i64.data(), DType::kI64, {2})},
      {"scalar", Tensor::make(&scalar, DType::kF32, {})},
      {"empty", Tensor::make(f32.data(), DType::kF32, {0, 4})},
  };
  const std::string p = path("model.safetensors");
  ASSERT_TRUE(write_safetensors(p, tensors, {{"format", "pt"}}).ok());
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  auto file = SafetensorsFile::open(p);
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const SafetensorsFile& f = **file;
  EXPECT_EQ(f.size(), tensors.size());
  EXPECT_EQ(f.header_bytes() % 8, 0u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.names().front(), "bf16");  // sorted

  uint64_t total = 0;
  for (const auto& [name, want] : tensors) {
    SCOPED_TRACE(name);
    auto got = f.tensor(name);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->ndim, want.ndim);
    EXPECT_EQ(got->shape_string(), want.shape_string());
    EXPECT_TRUE(got->is_contiguous());
    EXPECT_TRUE(got->device.is_cpu());
    ASSERT_EQ(got->nbytes(), want.nbytes());
    if (want.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(got->data, want.data, static_cast<size_t>(want.nbytes())), 0);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(got->data) %
                    static_cast<uintptr_t>(dtype_bytes(want.dtype, 1)),
                0u);
    }
    total += static_cast<uint64_t>(want.nbytes());
  }
  EXPECT_EQ(f.tensor_bytes(), total);

  auto e = f.info("bf16");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->dtype, SafetensorsDType::kBF16);
  EXPECT_EQ(safetensors_dtype_name((*e)->dtype), "BF16");
  EXPECT_EQ((*e)->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ((*e)->bytes(), 8u);
  EXPECT_EQ((*e)->numel, 4);
}

TEST_F(SafetensorsTest, TensorViewOutlivesFileThroughBuffer) {
  std::vector<float> v = {1, 2, 3, 4};
  const std::string p = path("a.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"w", Tensor::make(v.data(), DType::kF32, {4})}}).ok());
  Buffer buf;
  {
    auto f = SafetensorsFile::open(p);
    ASSERT_TRUE(f.ok());
    auto b = (*f)->buffer("w");
    ASSERT_TRUE(b.ok());
    buf = *b;
  }
  ASSERT_EQ(buf.bytes(), 16u);
  EXPECT_EQ(buf.residency(), Residency::kHostMapped);
  EXPECT_EQ(buf.as<float>()[3], 4.0f);
}

TEST_F(SafetensorsTest, ReadsHandCraftedFileWithGapFreeOffsets) {
  // The layout the Hugging Face writer produces, including space padding after the JSON.
  std::string data(12, '\0');
  const float one = 1.0f;
  std::memcpy(&data[8], &one, 4);
  const std::string p = craft(
      "x.safetensors",
      pad8(
          R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
          R"("b":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})"),
      data);
  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto b = (*f)->tensor("b");
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->ndim, 0);
  EXPECT_EQ(*b->ptr<float>(), 1.0f);
}

TEST_F(SafetensorsTest, UnsupportedDtypeParsesButTensorFails) {
  std::string header = R"({"d":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                       R"("u":{"dtype":"U16","shape":[2],"data_offsets":[16,20]},)"
                       R"("e":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[20,24]},)"
                       R"("b":{"dtype":"BOOL","shape":[8],"data_offsets":[24,32]}})";
  const std::string p = craft("odd.safetensors", header, std::string(32, '\0'));
  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->size(), 4u);
  ASSERT_TRUE((*f)->info("d").ok());
  expect_error((*f)->tensor("d"), StatusCode::kUnimplemented, {p, "'d'", "unsupported dtype F64"});
  expect_error((*f)->tensor("u"), StatusCode::kUnimplemented, {p, "'u'", "U16"});
  expect_error((*f)->tensor("e"), StatusCode::kUnimplemented, {p, "'e'", "F8_E5M2"});
  expect_error((*f)->tensor("b"), StatusCode::kUnimplemented, {p, "'b'", "BOOL"});
  EXPECT_TRUE((*f)->buffer("d").ok());  // the raw bytes are still reachable
}

TEST_F(SafetensorsTest, MoreThanFourDimsParsesButTensorFails) {
  const std::string p =
      craft("5d.safetensors", R"({"t":{"dtype":"U8","shape":[1,2,1,2,1],"data_offsets":[0,4]}})",
            std::string(4, '\0'));
  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find("t")->shape.size(), 5u);
  expect_error((*f)->tensor("t"), StatusCode::kUnimplemented, {p, "'t'", "5 dims"});
}

TEST_F(SafetensorsTest, MisalignedTensorIsRefused) {
  // F32 data starting at data offset 1: the header is padded to 8 so the file offset is odd.
  const std::string p = craft(
      "mis.safetensors",
      pad8(
          R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})"),
      std::string(5, '\0'));
  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE((*f)->tensor("a").ok());
  expect_error((*f)->tensor("b"), StatusCode::kUnimplemented, {p, "'b'", "aligned"});
}

TEST_F(SafetensorsTest, MissingTensor) {
  const std::string p =
      craft("m.safetensors", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE((*f)->has("zz"));
  EXPECT_EQ((*f)->find("zz"), nullptr);
  expect_error((*f)->tensor("zz"), StatusCode::kNotFound, {p, "'zz'", "not found"});
  expect_error((*f)->info("zz"), StatusCode::kNotFound, {p, "'zz'"});
}

TEST_F(SafetensorsTest, ParseInMemoryImage) {
  const std::string bytes =
      st_bytes(R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\1'));
  auto f =
      SafetensorsFile::parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->path(), "mem");
  EXPECT_EQ((*f)->data_bytes(), 8u);
  EXPECT_TRUE((*f)->buffer("a").ok());
}

// ---- bad files -----------------------------------------------------------------------------

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
  const std::string p = path("short.safetensors");
  write_file(p, "abc");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "3 bytes", "8-byte"});
  const std::string e = path("empty.safetensors");
  write_file(e, "");
  expect_error(SafetensorsFile::open(e), StatusCode::kDataLoss, {e, "0 bytes"});
}

TEST_F(SafetensorsTest, MissingFile) {
  const std::string p = path("nope.safetensors");
  expect_error(SafetensorsFile::open(p), StatusCode::kNotFound, {p});
}

TEST_F(SafetensorsTest, HeaderLengthPastEof) {
  std::string bytes = st_bytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})");
  bytes[0] = static_cast<char>(bytes[0] + 10);  // claims 10 more header bytes than exist
  const std::string p = path("trunc.safetensors");
  write_file(p, bytes);
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "past the end"});
}

TEST_F(SafetensorsTest, HeaderLengthAbsurd) {
  std::string bytes(64, ' ');
  const uint64_t n = uint64_t{1} << 40;
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  const std::string p = path("huge.safetensors");
  write_file(p, bytes);
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "absurd"});
  bytes.assign(16, '\xff');  // all-ones length
  write_file(p, bytes);
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "absurd"});
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  const std::string p = craft("nj.safetensors", R"({"a": {"dtype": )");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "not valid JSON"});
  const std::string q = craft("zero.safetensors", "");
  expect_error(SafetensorsFile::open(q), StatusCode::kDataLoss, {q, "not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotUtf8) {
  const std::string p =
      craft("utf.safetensors",
            "{\"a\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "not valid JSON", "UTF-8"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  const std::string p = craft("arr.safetensors", "[1, 2, 3]");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "an array, not a JSON object"});
  const std::string q = craft("str.safetensors", "\"hello\"");
  expect_error(SafetensorsFile::open(q), StatusCode::kDataLoss, {q, "not a JSON object"});
}

TEST_F(SafetensorsTest, HeaderNestedTooDeep) {
  std::string deep = R"({"a":)" + std::string(5000, '[') + std::string(5000, ']') + "}";
  const std::string p = craft("deep.safetensors", deep);
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "nests deeper"});
}

TEST_F(SafetensorsTest, DuplicateTensorName) {
  const std::string p = craft(
      "dup.safetensors",
      R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
      "xy");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "'w'", "twice"});
}

TEST_F(SafetensorsTest, EntryNotAnObject) {
  const std::string p = craft("eno.safetensors", R"({"w.weight": [1, 2]})");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "'w.weight'", "not an object"});
}

TEST_F(SafetensorsTest, EntryMissingFields) {
  const std::string a =
      craft("nodtype.safetensors", R"({"w.weight":{"shape":[1],"data_offsets":[0,1]}})", "x");
  expect_error(SafetensorsFile::open(a), StatusCode::kDataLoss, {a, "'w.weight'", "'dtype'"});
  const std::string b =
      craft("noshape.safetensors", R"({"w.weight":{"dtype":"U8","data_offsets":[0,1]}})", "x");
  expect_error(SafetensorsFile::open(b), StatusCode::kDataLoss, {b, "'w.weight'", "'shape'"});
  const std::string c =
      craft("nooff.safetensors", R"({"w.weight":{"dtype":"U8","shape":[1]}})", "x");
  expect_error(SafetensorsFile::open(c), StatusCode::kDataLoss,
               {c, "'w.weight'", "'data_offsets'"});
}

TEST_F(SafetensorsTest, FieldsOfWrongType) {
  const std::string a =
      craft("dtnum.safetensors", R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", "x");
  expect_error(SafetensorsFile::open(a), StatusCode::kDataLoss, {a, "'w'", "not a string"});
  const std::string b =
      craft("shapeobj.safetensors", R"({"w":{"dtype":"U8","shape":{},"data_offsets":[0,1]}})", "x");
  expect_error(SafetensorsFile::open(b), StatusCode::kDataLoss, {b, "'w'", "not an array"});
  const std::string c =
      craft("off3.safetensors", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", "x");
  expect_error(SafetensorsFile::open(c), StatusCode::kDataLoss, {c, "'w'", "[begin, end]"});
  const std::string d =
      craft("offneg.safetensors", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "x");
  expect_error(SafetensorsFile::open(d), StatusCode::kDataLoss, {d, "'w'", "non-negative"});
  const std::string e = craft("offfloat.safetensors",
                              R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}})", "x");
  expect_error(SafetensorsFile::open(e), StatusCode::kDataLoss, {e, "'w'", "non-negative"});
  const std::string m = craft("meta.safetensors", R"({"__metadata__":{"format":1}})");
  expect_error(SafetensorsFile::open(m), StatusCode::kDataLoss, {m, "__metadata__", "'format'"});
  const std::string m2 = craft("meta2.safetensors", R"({"__metadata__":"pt"})");
  expect_error(SafetensorsFile::open(m2), StatusCode::kDataLoss, {m2, "__metadata__"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  const std::string p =
      craft("dt.safetensors", R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})",
            std::string(16, '\0'));
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "'w'", "unknown dtype 'F128'"});
  const std::string q =
      craft("dtl.safetensors", R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})",
            std::string(4, '\0'));
  expect_error(SafetensorsFile::open(q), StatusCode::kDataLoss, {q, "'w'", "'f32'"});
}

TEST_F(SafetensorsTest, NegativeShape) {
  const std::string p =
      craft("neg.safetensors", R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss,
               {p, "'w'", "shape[1] is -1", "non-negative"});
  const std::string q =
      craft("fl.safetensors", R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,0]}})");
  expect_error(SafetensorsFile::open(q), StatusCode::kDataLoss, {q, "'w'", "shape[0]"});
}

TEST_F(SafetensorsTest, HugeShape) {
  const std::string a =
      craft("big1.safetensors",
            R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})");
  expect_error(SafetensorsFile::open(a), StatusCode::kDataLoss, {a, "'w'", "too large"});
  // Element count fits in int64 but its byte size does not.
  const std::string b =
      craft("big2.safetensors",
            R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})");
  expect_error(SafetensorsFile::open(b), StatusCode::kDataLoss, {b, "'w'", "too large"});
  const std::string c =
      craft("big3.safetensors",
            R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})");
  expect_error(SafetensorsFile::open(c), StatusCode::kDataLoss, {c, "'w'", "shape[0]"});
  const std::string d =
      craft("big4.safetensors", R"({"w":{"dtype":"U8","shape":[1e30],"data_offsets":[0,0]}})");
  expect_error(SafetensorsFile::open(d), StatusCode::kDataLoss, {d, "'w'", "shape[0]"});
  // An overflowing product times a zero dim is a legal empty tensor.
  const std::string e =
      craft("big5.safetensors",
            R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})");
  EXPECT_TRUE(SafetensorsFile::open(e).ok());
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  const std::string p =
      craft("oor.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
            std::string(12, '\0'));
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss,
               {p, "'w'", "past the data section", "12 bytes"});
  const std::string q = craft(
      "oor2.safetensors",
      R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})");
  expect_error(SafetensorsFile::open(q), StatusCode::kDataLoss, {q, "'w'", "past the data"});
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
  const std::string p =
      craft("be.safetensors", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[4,3]}})",
            std::string(8, '\0'));
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss,
               {p, "'w'", "[4, 3]", "begin past end"});
}

TEST_F(SafetensorsTest, SizeMismatch) {
  const std::string p =
      craft("sz.safetensors", R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}})",
            std::string(16, '\0'));
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss,
               {p, "'w'", "[3, 2]", "BF16", "needs 12 bytes", "hold 8"});
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  const std::string p = craft("ov.safetensors",
                              R"({"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b.weight":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                              std::string(12, '\0'));
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss,
               {p, "'a.weight'", "'b.weight'", "overlap"});
  // Same range twice.
  const std::string q = craft(
      "ov2.safetensors",
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
      std::string(4, '\0'));
  expect_error(SafetensorsFile::open(q), StatusCode::kDataLoss, {q, "'a'", "'b'", "overlap"});
  // Empty tensors occupy no bytes and overlap nothing.
  const std::string r = craft(
      "ov3.safetensors",
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
      std::string(4, '\0'));
  EXPECT_TRUE(SafetensorsFile::open(r).ok());
}

TEST_F(SafetensorsTest, ControlCharactersInNamesStayOnOneLine) {
  const std::string p = craft(
      "ctl.safetensors", R"({"bad\nname":{"dtype":"U8","shape":[1],"data_offsets":[0,2]}})", "xy");
  expect_error(SafetensorsFile::open(p), StatusCode::kDataLoss, {p, "bad\\x0aname"});
}

// ---- writer errors -------------------------------------------------------------------------

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<float> v(8, 1.0f);
  const std::string p = path("w.safetensors");
  Tensor t = Tensor::make(v.data(), DType::kF32, {2, 4});
  Status dup = write_safetensors(p, {{"a", t}, {"a", t}});
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("'a'"), std::string::npos) << dup.message();

  Status meta = write_safetensors(p, {{"__metadata__", t}});
  EXPECT_FALSE(meta.ok());

  Tensor q = Tensor::make(v.data(), DType::kQ4_0, {1, 32});
  Status quant = write_safetensors(p, {{"q", q}});
  EXPECT_EQ(quant.code(), StatusCode::kUnimplemented);
  EXPECT_NE(quant.message().find("'q'"), std::string::npos) << quant.message();

  Status strided = write_safetensors(p, {{"s", t.slice_cols(1, 3)}});
  EXPECT_EQ(strided.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(strided.message().find("contiguous"), std::string::npos);

  Status utf8 = write_safetensors(p, {{"bad\xff", t}});
  EXPECT_EQ(utf8.code(), StatusCode::kInvalidArgument);

  Status nodir = write_safetensors(path("no/such/dir/x.safetensors"), {{"a", t}});
  EXPECT_EQ(nodir.code(), StatusCode::kIoError);
  EXPECT_FALSE(fs::exists(p));
}

// ---- checkpoints ---------------------------------------------------------------------------

class CheckpointTest : public SafetensorsTest {
 protected:
  // Two shards plus an index, like a sharded Hugging Face repo.
  void write_sharded(const std::string& extra_index_entry = "") {
    a_ = {1, 2, 3, 4, 5, 6};
    b_ = {7, 8};
    c_ = {9, 10, 11};
    ASSERT_TRUE(write_safetensors(
                    path("model-00001-of-00002.safetensors"),
                    {{"model.embed_tokens.weight", Tensor::make(a_.data(), DType::kF32, {3, 2})},
                     {"model.norm.weight", Tensor::make(b_.data(), DType::kF32, {2})}},
                    {{"format", "pt"}})
                    .ok());
    ASSERT_TRUE(write_safetensors(path("model-00002-of-00002.safetensors"),
                                  {{"lm_head.weight", Tensor::make(c_.data(), DType::kF32, {3})}})
                    .ok());
    write_file(path("model.safetensors.index.json"),
               R"({"metadata":{"total_size":44},"weight_map":{)"
               R"("model.embed_tokens.weight":"model-00001-of-00002.safetensors",)"
               R"("model.norm.weight":"model-00001-of-00002.safetensors",)" +
                   extra_index_entry + R"("lm_head.weight":"model-00002-of-00002.safetensors"}})");
  }
  std::vector<float> a_, b_, c_;
};

TEST_F(CheckpointTest, SingleFileDirectory) {
  std::vector<float> v = {1, 2, 3, 4};
  ASSERT_TRUE(write_safetensors(path("model.safetensors"),
                                {{"w", Tensor::make(v.data(), DType::kF32, {2, 2})}})
                  .ok());
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->dir(), dir_);
  EXPECT_EQ((*ck)->names(), std::vector<std::string>{"w"});
  EXPECT_TRUE((*ck)->has("w"));
  EXPECT_EQ((*ck)->total_bytes(), 16u);
  auto t = (*ck)->tensor("w");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ptr<float>()[3], 4.0f);
  EXPECT_EQ((*ck)->shards().size(), 1u);
}

TEST_F(CheckpointTest, SingleFilePath) {
  std::vector<float> v = {1, 2};
  const std::string p = path("weights.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"w", Tensor::make(v.data(), DType::kF32, {2})}}).ok());
  auto ck = Checkpoint::open(p);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->dir(), dir_);
  EXPECT_TRUE((*ck)->tensor("w").ok());
}

TEST_F(CheckpointTest, ShardedRoundTrip) {
  write_sharded();
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const Checkpoint& c = **ck;
  EXPECT_EQ(c.shards().size(), 2u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                                 "model.norm.weight"}));
  EXPECT_EQ(c.total_bytes(), 44u);
  auto emb = c.tensor("model.embed_tokens.weight");
  ASSERT_TRUE(emb.ok());
  EXPECT_EQ(emb->shape_string(), "[3, 2]");
  EXPECT_EQ(emb->ptr<float>()[5], 6.0f);
  auto head = c.tensor("lm_head.weight");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->ptr<float>()[2], 11.0f);
  EXPECT_NE(c.shard_of("lm_head.weight"), c.shard_of("model.norm.weight"));
  ASSERT_NE(c.find("model.norm.weight"), nullptr);
  EXPECT_EQ(c.find("model.norm.weight")->bytes(), 8u);
  auto buf = c.buffer("model.norm.weight");
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->as<float>()[1], 8.0f);

  uint64_t last_done = 0, last_total = 0;
  int calls = 0;
  c.prefault([&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
  });
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(last_done, 44u);
  EXPECT_EQ(last_total, 44u);

  // The index file itself may be given.
  auto by_index = Checkpoint::open(path("model.safetensors.index.json"));
  ASSERT_TRUE(by_index.ok()) << by_index.status().to_string();
  EXPECT_EQ((*by_index)->names().size(), 3u);
}

TEST_F(CheckpointTest, TensorNotFound) {
  write_sharded();
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok());
  EXPECT_FALSE((*ck)->has("model.layers.0.self_attn.q_proj.weight"));
  expect_error(
      (*ck)->tensor("model.layers.0.self_attn.q_proj.weight"), StatusCode::kNotFound,
      {dir_ + ": tensor 'model.layers.0.self_attn.q_proj.weight' not found in checkpoint"});
  expect_error((*ck)->info("x"), StatusCode::kNotFound, {dir_, "'x'"});
  expect_error((*ck)->buffer("x"), StatusCode::kNotFound, {dir_, "'x'"});
}

TEST_F(CheckpointTest, MissingShard) {
  write_sharded(R"("model.layers.0.mlp.up_proj.weight":"model-00003-of-00002.safetensors",)");
  expect_error(Checkpoint::open(dir_), StatusCode::kNotFound,
               {"model.safetensors.index.json", "model-00003-of-00002.safetensors",
                "model.layers.0.mlp.up_proj.weight", "not found"});
}

TEST_F(CheckpointTest, MappedTensorMissingFromItsShard) {
  write_sharded(R"("model.layers.0.mlp.up_proj.weight":"model-00002-of-00002.safetensors",)");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss,
               {"model.safetensors.index.json", "model.layers.0.mlp.up_proj.weight",
                "model-00002-of-00002.safetensors", "no such tensor"});
}

TEST_F(CheckpointTest, TensorInWrongShard) {
  write_sharded();
  write_file(path("model.safetensors.index.json"),
             R"({"weight_map":{"model.embed_tokens.weight":"model-00002-of-00002.safetensors",)"
             R"("lm_head.weight":"model-00002-of-00002.safetensors"}})");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss,
               {"model.embed_tokens.weight", "model-00002-of-00002.safetensors"});
}

TEST_F(CheckpointTest, TensorInTwoShards) {
  write_sharded();
  std::vector<float> v = {0, 0};
  ASSERT_TRUE(write_safetensors(path("model-00002-of-00002.safetensors"),
                                {{"lm_head.weight", Tensor::make(c_.data(), DType::kF32, {3})},
                                 {"model.norm.weight", Tensor::make(v.data(), DType::kF32, {2})}})
                  .ok());
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss,
               {dir_, "'model.norm.weight'", "two shards", "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"});
}

TEST_F(CheckpointTest, BadShardPropagatesItsError) {
  write_sharded();
  write_file(path("model-00002-of-00002.safetensors"), "xx");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss,
               {path("model-00002-of-00002.safetensors"), "too short"});
}

TEST_F(CheckpointTest, BadIndex) {
  const std::string idx = path("model.safetensors.index.json");
  write_file(idx, "{not json");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss, {idx, "not valid JSON"});
  write_file(idx, R"({"metadata":{}})");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss, {idx, "weight_map"});
  write_file(idx, R"({"weight_map":{}})");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss, {idx, "empty"});
  write_file(idx, R"({"weight_map":{"w":3}})");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss, {idx, "'w'"});
  write_file(idx, R"({"weight_map":{"w":"../../etc/passwd"}})");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss, {idx, "'w'", "../../etc/passwd"});
  write_file(idx, R"({"weight_map":{"w":"/etc/passwd"}})");
  expect_error(Checkpoint::open(dir_), StatusCode::kDataLoss, {idx, "'w'", "/etc/passwd"});
  write_file(idx, R"({"weight_map":{"a\nb":"gone\n.safetensors"}})");
  expect_error(Checkpoint::open(dir_), StatusCode::kNotFound, {idx, "'a\\x0ab'", "gone\\x0a"});
}

TEST_F(CheckpointTest, NoWeightsInDirectory) {
  expect_error(Checkpoint::open(dir_), StatusCode::kNotFound,
               {dir_, "model.safetensors", "model.safetensors.index.json"});
  const std::string nowhere = path("does-not-exist");
  expect_error(Checkpoint::open(nowhere), StatusCode::kNotFound, {nowhere});
}

TEST_F(CheckpointTest, SingleFileWinsOverIndex) {
  write_sharded();
  std::vector<float> v = {5};
  ASSERT_TRUE(write_safetensors(path("model.safetensors"),
                                {{"only", Tensor::make(v.data(), DType::kF32, {1})}})
                  .ok());
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok());
  EXPECT_EQ((*ck)->names(), std::vector<std::string>{"only"});
}

}  // namespace
}  // namespace strata

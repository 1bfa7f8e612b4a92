// mxoid's fused metric operators: the per-row values of accuracy and cross-entropy.
//
// mxoid_metric_rows(pred, label, columns="accuracy,cross_entropy") -> (rows, columns)
// float64, from float32 scores pred (rows, classes) and float32 labels (rows,). It
// computes, in one operator, what mxoid's metric head otherwise computes with a dozen
// MXNet operators (see mxoid/metrics/head.py), with the same arithmetic, so that the
// values are bit for bit the same:
//
// - accuracy: 1 where argmax(pred, axis=1) equals fix(label), else 0; the argmax is
//   MXNet's (mshadow's reduce_with_axis with red::maximum: the first largest score; a
//   NaN stops the search at the NaN), compared as a float32 index with the label
//   truncated toward zero (a NaN label never hits).
// - cross_entropy: -log(pick(pred, label) + 1e-12) in float32, as pick (mode 'clip':
//   the label cast to an index, then clipped to the classes), _plus_scalar, log and
//   negative compute it, then widened to float64.
//
// mxoid_metric_sums(pred, label, counting, sums, columns=...) -> the same values; and,
// when counting (one float64) is not 0, adds them to sums (float64, shaped like the
// values), an input the operator writes, which MXNet therefore binds as an auxiliary
// state. TrainingMonitoring's running sums: one operator per batch and device in the
// training forward pass, where MXNet's operators need five more and the backward pass.
//
// Built by mxoid/metrics/native/__init__.py against the lib_api.h that the installed
// MXNet ships, and loaded with mx.library.load.

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "mxnet/lib_api.h"

using namespace mxnet::ext;

typedef std::unordered_map<std::string, std::string> Attrs;

enum Column { kAccuracy = 0, kCrossEntropy = 1 };

// The columns attribute, "accuracy,cross_entropy" for instance (parsed in every pass:
// kept cheap, without streams).
static bool ParseColumns(const Attrs& attrs, std::vector<Column>* columns) {
  auto found = attrs.find("columns");
  if (found == attrs.end()) return false;
  const std::string& text = found->second;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (text.compare(start, end - start, "accuracy") == 0) {
      columns->push_back(kAccuracy);
    } else if (text.compare(start, end - start, "cross_entropy") == 0) {
      columns->push_back(kCrossEntropy);
    } else {
      return false;
    }
    start = end + 1;
  }
  return !columns->empty();
}

// Checks the columns attribute of operator `name`, which takes `inputs` inputs.
static MXReturnValue CheckAttrs(const char* name, int inputs, const Attrs& attrs, int* num_in,
                                int* num_out) {
  std::vector<Column> columns;
  if (!ParseColumns(attrs, &columns)) {
    MX_ERROR_MSG << name << ": 'columns' must list accuracy and/or cross_entropy";
    return MX_FAIL;
  }
  *num_in = inputs;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue ParseAttrs(const Attrs& attrs, int* num_in, int* num_out) {
  return CheckAttrs("mxoid_metric_rows", 2, attrs, num_in, num_out);
}

MXReturnValue InferType(const Attrs& attrs, std::vector<int>* in_types,
                        std::vector<int>* out_types) {
  if (in_types->at(0) != kFloat32 || in_types->at(1) != kFloat32) {
    MX_ERROR_MSG << "mxoid_metric_rows takes float32 scores and labels";
    return MX_FAIL;
  }
  out_types->at(0) = kFloat64;
  return MX_SUCCESS;
}

MXReturnValue InferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  const std::vector<unsigned int>& pred = in_shapes->at(0);
  const std::vector<unsigned int>& label = in_shapes->at(1);
  if (pred.size() != 2 || pred[1] == 0 || label.size() != 1 || label[0] != pred[0]) {
    MX_ERROR_MSG << "mxoid_metric_rows takes scores (rows, classes) and labels (rows,)";
    return MX_FAIL;
  }
  std::vector<Column> columns;
  ParseColumns(attrs, &columns);
  out_shapes->at(0) = {pred[0], static_cast<unsigned int>(columns.size())};
  return MX_SUCCESS;
}

// The index of mshadow's reduce_with_axis<red::maximum, true> along one row: the running
// maximum takes a score unless it is already >= the score (so a NaN score is taken), and
// once it is NaN it stays; the index follows each change. Written without branches (the
// comparisons of softmax scores are unpredictable).
static float ArgMax(const float* row, int64_t classes) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t index = 0;
  for (int64_t k = 0; k < classes; ++k) {
    const float score = row[k];
    const bool take = (best == best) & !(best >= score);
    best = take ? score : best;
    index = take ? k : index;
  }
  return static_cast<float>(static_cast<int>(index));
}

// pick(row, label, mode='clip'), as MXNet's pick kernel indexes: index_t is int32_t in
// MXNet 1.x builds without large-tensor support, as the pip wheels are.
static float Pick(const float* row, int64_t classes, float label) {
  int64_t j = static_cast<int32_t>(label);
  if (j <= 0) {
    j = 0;
  } else if (j >= classes) {
    j = classes - 1;
  }
  return row[j];
}

// Writes the values of the columns for pred and label into out (rows x columns).
static void Values(const std::vector<Column>& columns, MXTensor* pred_tensor,
                   MXTensor* label_tensor, double* out) {
  const float* pred = pred_tensor->data<float>();
  const float* label = label_tensor->data<float>();
  const int64_t rows = pred_tensor->shape[0];
  const int64_t classes = pred_tensor->shape[1];
  const size_t width = columns.size();
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = pred + i * classes;
    for (size_t c = 0; c < width; ++c) {
      double value;
      if (columns[c] == kAccuracy) {
        value = ArgMax(row, classes) == std::trunc(label[i]) ? 1.0 : 0.0;
      } else {
        const float eps = static_cast<float>(1e-12);
        value = static_cast<double>(-std::log(Pick(row, classes, label[i]) + eps));
      }
      out[i * width + c] = value;
    }
  }
}

MXReturnValue Forward(const Attrs& attrs, std::vector<MXTensor>* inputs,
                      std::vector<MXTensor>* outputs, const OpResource& res) {
  std::vector<Column> columns;
  ParseColumns(attrs, &columns);
  Values(columns, &inputs->at(0), &inputs->at(1), outputs->at(0).data<double>());
  return MX_SUCCESS;
}

REGISTER_OP(mxoid_metric_rows)
    .setParseAttrs(ParseAttrs)
    .setInferType(InferType)
    .setInferShape(InferShape)
    .setForward(Forward, "cpu");

// ---------------------------------------------------------------- mxoid_metric_sums
enum SumsInput { kPred = 0, kLabel = 1, kCounting = 2, kSums = 3 };

MXReturnValue ParseSumsAttrs(const Attrs& attrs, int* num_in, int* num_out) {
  return CheckAttrs("mxoid_metric_sums", 4, attrs, num_in, num_out);
}

MXReturnValue InferSumsType(const Attrs& attrs, std::vector<int>* in_types,
                            std::vector<int>* out_types) {
  if (in_types->at(kPred) != kFloat32 || in_types->at(kLabel) != kFloat32) {
    MX_ERROR_MSG << "mxoid_metric_sums takes float32 scores and labels";
    return MX_FAIL;
  }
  for (int input : {kCounting, kSums}) {
    if (in_types->at(input) != -1 && in_types->at(input) != kFloat64) {
      MX_ERROR_MSG << "mxoid_metric_sums keeps its switch and sums in float64";
      return MX_FAIL;
    }
    in_types->at(input) = kFloat64;
  }
  out_types->at(0) = kFloat64;
  return MX_SUCCESS;
}

MXReturnValue InferSumsShape(const Attrs& attrs,
                             std::vector<std::vector<unsigned int>>* in_shapes,
                             std::vector<std::vector<unsigned int>>* out_shapes) {
  std::vector<std::vector<unsigned int>> values_in(in_shapes->begin(), in_shapes->begin() + 2);
  std::vector<std::vector<unsigned int>> values_out(1);
  if (InferShape(attrs, &values_in, &values_out) != MX_SUCCESS) return MX_FAIL;
  in_shapes->at(kCounting) = {1};
  in_shapes->at(kSums) = values_out[0];
  out_shapes->at(0) = values_out[0];
  return MX_SUCCESS;
}

// Every input and output is dense (MXNet cannot tell for the auxiliary state by itself).
MXReturnValue InferSumsStorage(const Attrs& attrs, std::vector<int>* in_stypes,
                               std::vector<int>* out_stypes) {
  for (int& stype : *in_stypes) stype = kDefaultStorage;
  for (int& stype : *out_stypes) stype = kDefaultStorage;
  return MX_SUCCESS;
}

MXReturnValue SumsMutated(const Attrs& attrs, std::vector<int>* inputs) {
  inputs->push_back(kSums);
  return MX_SUCCESS;
}

MXReturnValue SumsForward(const Attrs& attrs, std::vector<MXTensor>* inputs,
                          std::vector<MXTensor>* outputs, const OpResource& res) {
  std::vector<Column> columns;
  ParseColumns(attrs, &columns);
  double* values = outputs->at(0).data<double>();
  Values(columns, &inputs->at(kPred), &inputs->at(kLabel), values);
  if (inputs->at(kCounting).data<double>()[0] != 0) {
    double* sums = inputs->at(kSums).data<double>();
    const int64_t size = inputs->at(kPred).shape[0] * static_cast<int64_t>(columns.size());
    for (int64_t i = 0; i < size; ++i) sums[i] += values[i];
  }
  return MX_SUCCESS;
}

REGISTER_OP(mxoid_metric_sums)
    .setParseAttrs(ParseSumsAttrs)
    .setInferType(InferSumsType)
    .setInferShape(InferSumsShape)
    .setInferSType(InferSumsStorage)
    .setMutateInputs(SumsMutated)
    .setForward(SumsForward, "cpu");

MXReturnValue initialize(int version) { return MX_SUCCESS; }

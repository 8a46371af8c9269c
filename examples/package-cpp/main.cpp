// Load a `quantstudy package` .pt2 with libtorch's AOTIModelPackageLoader and run one batch.
//
// usage: run_package PACKAGE.pt2 DEVICE DTYPE BATCH CHANNELS HEIGHT WIDTH [VALUE]
//   DEVICE cuda or cpu, DTYPE float16 / bfloat16 / float32 (the manifest's "input"), and the
//   input filled with VALUE (default 0.5), laid out channels-last as the packages expect.
// Prints the output's shape and each row's top-1 class, one line per row.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 8) {
    std::cerr << "usage: " << argv[0]
              << " PACKAGE.pt2 DEVICE DTYPE BATCH CHANNELS HEIGHT WIDTH [VALUE]\n";
    return 2;
  }
  const std::string dtype_name = argv[3];
  const auto dtype = dtype_name == "float16"    ? at::kHalf
                     : dtype_name == "bfloat16" ? at::kBFloat16
                                                : at::kFloat;
  const c10::Device device{std::string(argv[2])};
  const double value = argc > 8 ? std::stod(argv[8]) : 0.5;
  c10::InferenceMode inference;
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  auto x = at::full({std::stol(argv[4]), std::stol(argv[5]), std::stol(argv[6]),
                        std::stol(argv[7])},
                       value, at::TensorOptions().dtype(dtype).device(device))
               .contiguous(at::MemoryFormat::ChannelsLast);
  std::vector<at::Tensor> outputs = loader.run({x});
  auto logits = outputs.at(0).to(at::kCPU, at::kFloat);
  std::cout << "output " << logits.sizes() << "\n";
  auto top1 = logits.argmax(1);
  for (int64_t i = 0; i < top1.size(0); ++i) {
    std::cout << "top1 " << top1[i].item<int64_t>() << "\n";
  }
  return 0;
}

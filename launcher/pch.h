// Precompiled header shared by every batchdist target (see CMakeLists.txt).
#pragma once
#include <torch/torch.h>

// Status and Result<T> live in the client library's public folder (tandem/status.h), which is
// part of target tandem_base; tandem's own code keeps including them by this name.
#pragma once

#include "tandem/status.h"

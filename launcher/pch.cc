// Anchors the precompiled header target; nothing else lives here.
#include "launcher/pch.h"

// The factor scale.cu multiplies by: edit it and the next compile is a miss.
#define SCALE 2.0f

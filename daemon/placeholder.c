void tbd__placeholder(void) {}

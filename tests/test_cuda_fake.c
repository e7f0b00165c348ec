/* placeholder, filled in step 2 */
#include "testutil.h"
int main(int argc, char **argv) { (void)argc; (void)argv; return 0; }

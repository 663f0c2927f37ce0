// The translation unit that builds the tests' shared precompiled header
// (tests/common/CMakeLists.txt, target vemesh_test_pch); it has no code.
